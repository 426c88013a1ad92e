"""Provider conformance: what Strands' own provider tests check of a model provider (the ``tests/`` and
``tests_integ/`` of the strands-agents 1.62.0 source distribution: ``tests_integ/models/test_conformance.py``,
the per-provider ``test_model_*.py``, ``test_max_tokens_reached.py``, ``test_context_overflow.py``,
``test_invalid_tool_names.py``, ``test_stream_agent.py``, ``test_agent_async.py``, ``test_session.py``,
``test_cancellation.py`` and ``tests/strands/models/test_model.py``), written for ``SGLangModel`` and run
against the dev server, so a Strands upgrade is checked the way Strands checks its own providers.
What does not apply to a token-in/token-out provider, and why, is listed in docs/provider.md
("Strands features with TITO").

Every agent here is an ordinary Strands ``Agent`` with the model's plugin; the dev server runs on its
own loop because the synchronous ``agent(...)`` runs the loop in a thread."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import strands_agents
from helpers import tool_call
from strands import Agent, tool
from strands.agent.conversation_manager import SlidingWindowConversationManager
from strands.event_loop.streaming import process_stream
from strands.hooks import BeforeModelCallEvent
from strands.middleware import ModelStopReason
from strands.session import FileSessionManager
from strands.types.exceptions import ContextWindowOverflowException, MaxTokensReachedException
from strands_agents import quick_client
from threaded_app import devserver_in_thread

from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangClient
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.tool_parsers import INVALID_TOOL_NAME

pytestmark = pytest.mark.unit

TIME_AND_WEATHER = (
    "<think>\nBoth tools.\n</think>\n\n"
    + tool_call("", "tool_time").replace('"arguments": {"code": ""}', '"arguments": {}')
    + "\n"
    + tool_call("", "tool_weather").replace('"arguments": {"code": ""}', '"arguments": {}')
)
PROFILE = '{"name": "John", "age": 25, "occupation": "dentist"}'
SCRIPT = [
    {"match": "What is 3+3", "replies": ["6"]},
    {"match": "<tool_response>\nsunny\n", "replies": ["It is 12:00 and sunny."]},
    {"match": "time and weather", "replies": [TIME_AND_WEATHER]},
    {
        "match": "Create a profile",
        "replies": [f'<tool_call>\n{{"name": "UserProfile", "arguments": {PROFILE}}}\n</tool_call>'],
    },
    {"match": "How are you", "replies": ['{"time": "12:00", "weather": "sunny"}']},
    {"match": "Tell me a story", "replies": ["Once upon a time " * 40]},
    {"match": "invalid tool", "replies": [tool_call("", "invalid tool"), "The tool call was refused."]},
    {"match": "What is 2+2", "replies": ["4"]},
    {"match": None, "replies": ["Hello."]},
]


@tool
def tool_time() -> str:
    """Tell the time."""
    return "12:00"


@tool
def tool_weather() -> str:
    """Tell the weather."""
    return "sunny"


TOOLS = [tool_time, tool_weather]


class UserProfile(pydantic.BaseModel):
    """Basic user profile model."""

    name: str
    age: int
    occupation: str


class Weather(pydantic.BaseModel):
    """Extract time and weather values."""

    time: str
    weather: str


@pytest.fixture(scope="module")
def server() -> Iterator[DevServer]:
    with devserver_in_thread("scripted", script=SCRIPT) as running:
        yield running


@pytest.fixture
def url(server: DevServer) -> str:
    server.clear_request_log()
    return server.url


@pytest.fixture
async def client(url: str) -> AsyncIterator[SGLangClient]:
    client = quick_client(url)
    yield client
    await client.close()


def new_model(tokenizer: Any, url: str, **options: Any) -> SGLangModel:
    return SGLangModel(tokenizer=tokenizer, base_url=url, model_id="scripted", **options)


def make_agent(model: SGLangModel, **options: Any) -> Agent:
    return strands_agents.make_agent(model, **{"tools": TOOLS, **options})


def prompts(server: DevServer, tokenizer: Any) -> list[str]:
    return [tokenizer.decode(entry["json"]["input_ids"]) for entry in server.request_log]


# ---------------------------------------------------------------------- the Model interface


def test_the_model_reports_a_dict_config_and_updates_it(qwen3_tokenizer: Any, url: str) -> None:
    model = new_model(qwen3_tokenizer, url, context_window_limit=200_000)
    config = model.get_config()
    assert isinstance(config, dict) and config.get("model_id") == "scripted", "the tracer calls .get()"
    assert model.context_window_limit == 200_000 and model.stateful is False
    model.update_config(sampling_params={"temperature": 0.5})
    assert model.get_config()["sampling_params"] == {"temperature": 0.5}


async def test_stream_yields_the_events_strands_assembles(qwen3_tokenizer: Any, client: SGLangClient) -> None:
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    messages: list[Any] = [{"role": "user", "content": [{"text": "What is the time and weather?"}]}]
    events = [event async for event in model.stream(messages, [t.tool_spec for t in TOOLS], "Be brief.")]
    assert events[0] == {"messageStart": {"role": "assistant"}}
    starts = [e["contentBlockStart"]["start"] for e in events if "contentBlockStart" in e]
    assert [s.get("toolUse", {}).get("name") for s in starts] == [None, "tool_time", "tool_weather"]
    assert sum("contentBlockStop" in e for e in events) == len(starts), "every block is closed"
    tool_inputs = [
        e["contentBlockDelta"]["delta"]["toolUse"]["input"] for e in events if "toolUse" in str(e)[:40]
    ]
    assert all(isinstance(value, str) for value in tool_inputs), "tool input is a JSON string"
    assert events[-2] == {"messageStop": {"stopReason": "tool_use"}}
    usage = events[-1]["metadata"]["usage"]
    assert usage["inputTokens"] + usage["outputTokens"] == usage["totalTokens"] > 0
    assert isinstance(events[-1]["metadata"]["metrics"]["latencyMs"], int)
    stop = None
    async for event in process_stream(_replay(events)):
        if isinstance(event, ModelStopReason):
            stop = event["stop"]
    assert stop is not None and stop[0] == "tool_use"
    assert [b["toolUse"]["name"] for b in stop[1]["content"] if "toolUse" in b] == [
        "tool_time",
        "tool_weather",
    ]


async def _replay(events: list[Any]) -> AsyncIterator[Any]:
    for event in events:
        yield event


async def test_count_tokens_counts_the_tool_specs_and_system_prompt(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    messages: list[Any] = [{"role": "user", "content": [{"text": "What is the capital of France?"}]}]
    without = await model.count_tokens(messages)
    with_tools = await model.count_tokens(
        messages, tool_specs=[t.tool_spec for t in TOOLS], system_prompt="Be helpful."
    )
    assert isinstance(without, int) and 0 < without < with_tools


# ---------------------------------------------------------------------- agents


def test_a_synchronous_agent_answers_with_its_tools(qwen3_tokenizer: Any, url: str) -> None:
    model = new_model(qwen3_tokenizer, url)
    result = make_agent(model)("What is the time and weather in New York?")
    text = result.message["content"][0]["text"].lower()
    assert "12:00" in text and "sunny" in text
    assert model.trajectory.num_outputs == 2 and result.metrics.tool_metrics


async def test_an_async_agent_streams_the_text_it_keeps(qwen3_tokenizer: Any, client: SGLangClient) -> None:
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = make_agent(model)
    streamed = ""
    async for event in agent.stream_async("What is the time and weather in New York?"):
        if "event" in event and "contentBlockDelta" in event["event"]:
            streamed += event["event"]["contentBlockDelta"]["delta"].get("text", "")
    assert agent.messages[-1]["content"][0]["text"] == "It is 12:00 and sunny." and streamed.endswith(
        "It is 12:00 and sunny."
    )


async def test_a_prompt_of_content_blocks_and_both_system_prompt_forms(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer
) -> None:
    blocks = [{"text": "SYSTEM_TEST one."}, {"cachePoint": {"type": "default"}}, {"text": "SYSTEM_TEST two."}]
    for system_prompt in ("BACKWARD_COMPAT_TEST", blocks):
        model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
        result = await make_agent(model, tools=[], system_prompt=system_prompt).invoke_async(
            [{"text": "What is 2+2?"}, {"text": "Please be brief."}]
        )
        assert result.message["content"][0]["text"] == "4"
    texts = prompts(server, qwen3_tokenizer)
    assert "<|im_start|>system\nBACKWARD_COMPAT_TEST<|im_end|>" in texts[0]
    assert "<|im_start|>system\nSYSTEM_TEST one.\nSYSTEM_TEST two.<|im_end|>" in texts[1]
    assert "What is 2+2?\nPlease be brief." in texts[1]


async def test_structured_output_is_forced_in_the_agent_loop(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    pytest.importorskip("xgrammar")  # the scripted server checks replies against the request's grammar
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    result = await make_agent(model, tools=[]).invoke_async(
        "Create a profile for John who is a 25 year old dentist", structured_output_model=UserProfile
    )
    assert result.structured_output == UserProfile(name="John", age=25, occupation="dentist")


async def test_the_deprecated_structured_output_call_runs_beside_the_episode(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    """``agent.structured_output`` calls the model outside the agent loop and keeps nothing in the
    history: on a model an agent holds it is a side call, so the episode's trajectory is unchanged."""
    pytest.importorskip("xgrammar")
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = make_agent(model, tools=[])
    await agent.invoke_async("What is 2+2?")
    before = model.trajectory.token_ids.tolist()
    with pytest.warns(DeprecationWarning):
        weather = await agent.structured_output_async(Weather, "How are you?")
    assert weather == Weather(time="12:00", weather="sunny")
    assert model.trajectory.token_ids == before and model.stats.side_calls == 1
    result = await agent.invoke_async("What is 2+2?")
    assert result.stop_reason == "end_turn" and model.trajectory.num_outputs == 2


async def test_max_tokens_reached_then_the_agent_runs_again(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, sampling_params={"max_new_tokens": 10})
    agent = make_agent(model)
    with pytest.raises(MaxTokensReachedException):
        await agent.invoke_async("Tell me a story!")
    assert model.trajectory.response_length == 10
    result = await agent.invoke_async("What is 3+3")
    assert result.stop_reason == "end_turn" and model.trajectory.num_outputs == 2


async def test_a_context_overflow_is_strands_exception_and_a_manager_recovers(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    too_long: list[Any] = [
        {"role": "user", "content": [{"text": "Too much text! " * 300}]},
        {"role": "assistant", "content": [{"text": "That was a lot of text!"}]},
    ]
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, context_window_limit=512)
    with pytest.raises(ContextWindowOverflowException):
        await make_agent(model, messages=json.loads(json.dumps(too_long))).invoke_async("Hi!")
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, context_window_limit=512)
    manager = SlidingWindowConversationManager(window_size=40)  # the reply then needs 128 (512 / 4)
    agent = make_agent(model, messages=json.loads(json.dumps(too_long)), conversation_manager=manager)
    await agent.invoke_async("Hi!")
    assert len(agent.messages) == 2 and model.trajectory.num_outputs == 1


async def test_later_turns_report_the_cached_prompt(qwen3_tokenizer: Any, client: SGLangClient) -> None:
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = make_agent(model)
    await agent.invoke_async("What is the time and weather in New York?")
    usages = [m["metadata"]["usage"] for m in agent.messages if m["role"] == "assistant"]
    assert 0 < usages[1]["cacheReadInputTokens"] < usages[1]["inputTokens"], "the first turn's prefix"
    accumulated = agent.event_loop_metrics.accumulated_usage["cacheReadInputTokens"]
    assert accumulated == sum(usage.get("cacheReadInputTokens", 0) for usage in usages)


async def test_concurrent_agents_each_with_its_model(qwen3_tokenizer: Any, client: SGLangClient) -> None:
    models = [SGLangModel(tokenizer=qwen3_tokenizer, client=client) for _ in range(4)]
    results = await asyncio.gather(
        *(make_agent(m).invoke_async("What is the time and weather?") for m in models)
    )
    assert all(r.stop_reason == "end_turn" for r in results)
    assert len({tuple(m.trajectory.token_ids.tolist()[-20:]) for m in models}) == 1


async def test_cancelling_before_the_model_call(qwen3_tokenizer: Any, client: SGLangClient) -> None:
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = make_agent(model)
    agent.add_hook(lambda event: agent.cancel(), BeforeModelCallEvent)
    result = await agent.invoke_async("What is 2+2?")
    assert result.stop_reason == "cancelled" and result.message["content"] == [{"text": "Cancelled by user"}]
    assert len(model.trajectory) == 0, "no call was made"


async def test_an_invalid_tool_name_is_stored_and_survives_a_session(
    qwen3_tokenizer: Any, client: SGLangClient, tmp_path: Path
) -> None:
    """The model writes a call to a tool name Strands would refuse: it is stored as
    ``invalid_tool_call`` with an error result, persisted, and a restored agent goes on."""

    @tool
    def fake_shell(command: str) -> str:
        """Run a command.

        Args:
            command: The command.
        """
        return "Done!"

    def agent_for(model: SGLangModel) -> Agent:
        return make_agent(
            model,
            tools=[fake_shell],
            agent_id="an_agent",
            session_manager=FileSessionManager(session_id="test", storage_dir=str(tmp_path)),
        )

    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = agent_for(model)
    await agent.invoke_async("Invoke the `invalid tool` tool and tell me what the response is")
    await agent.invoke_async("What was the response?")
    assert len(agent.messages) == 6 and model.stats.parse_errors == 1
    use = next(b["toolUse"] for b in agent.messages[1]["content"] if "toolUse" in b)
    result = agent.messages[2]["content"][0]["toolResult"]
    assert use["name"] == INVALID_TOOL_NAME and result["status"] == "error"
    assert "invalid tool name 'invalid tool'" in result["content"][0]["text"]
    restored_model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    restored = agent_for(restored_model)
    assert len(restored.messages) == 6
    await restored.invoke_async("What was the tool result")
    assert restored_model.trajectory.token_ids[: len(model.trajectory)] == model.trajectory.token_ids


async def test_a_file_session_keeps_and_restores_the_conversation(
    qwen3_tokenizer: Any, client: SGLangClient, tmp_path: Path
) -> None:
    sessions = FileSessionManager(session_id="hello", storage_dir=str(tmp_path))
    agent = make_agent(SGLangModel(tokenizer=qwen3_tokenizer, client=client), session_manager=sessions)
    await agent.invoke_async("Hello!")
    assert len(sessions.list_messages("hello", agent.agent_id)) == 2
    again = FileSessionManager(session_id="hello", storage_dir=str(tmp_path))
    restored = make_agent(SGLangModel(tokenizer=qwen3_tokenizer, client=client), session_manager=again)
    assert len(restored.messages) == 2
    await restored.invoke_async("Hello!")
    assert len(restored.messages) == 4 and len(again.list_messages("hello", restored.agent_id)) == 4


async def test_reasoning_in_the_history_with_thinking_disabled(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    history: list[Any] = [
        {"role": "user", "content": [{"text": "Hi"}]},
        {
            "role": "assistant",
            "content": [{"reasoningContent": {"reasoningText": {"text": "Greet back."}}}, {"text": "Hello."}],
        },
    ]
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, enable_thinking=False)
    result = await make_agent(model, tools=[], messages=history).invoke_async("What is 2+2?")
    assert result.message["content"][0]["text"] == "4"
