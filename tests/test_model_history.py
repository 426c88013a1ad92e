"""The model reads only the messages after its last output: Strands hands it just those (middleware),
and the token trajectory is the same as when it gets the whole history."""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from helpers import think, tool_call
from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager
from strands.event_loop.streaming import process_stream
from strands.middleware import InvokeModelStage, ModelStopReason

from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangClient
from strands_slime.provider.model import SGLangModel

SCRIPT = [
    {
        "match": "triangle",
        "replies": [
            think("Compute area.", "Computing.\n" + tool_call("print(3*4/2)")),
            think("Check once more.", tool_call("print(6)") + "\n" + tool_call("print(6.0)")),
            think("Check again.", tool_call("print(2*3)")),
            think("Done.", "Answer: \\boxed{6}"),
        ],
    }
]
PROMPT = "Area of the triangle with legs 3 and 4?"

pytestmark = pytest.mark.unit


def tool_output(code: str) -> str:
    return f"ran: {code}"


@tool
async def execute_python_code(code: str) -> str:
    """Execute Python code and return what it prints.

    Args:
        code: The program to run.
    """
    return tool_output(code)


@pytest.fixture
async def client() -> AsyncIterator[SGLangClient]:
    server = await DevServer(backend="scripted", script=SCRIPT).start()
    client = SGLangClient(server.url, retry_delay=0.01, max_retry_delay=0.05)
    yield client
    await client.close()
    await server.stop()


def make_agent(model: SGLangModel) -> Agent:
    return Agent(
        model=model,
        tools=[execute_python_code],
        callback_handler=None,
        conversation_manager=NullConversationManager(),
        retry_strategy=None,
        plugins=[model.plugin()],
    )


def trajectory_lists(model: SGLangModel) -> tuple[list[int], list[int], list[float]]:
    model.trajectory.check()
    trajectory = model.trajectory
    return trajectory.token_ids.tolist(), trajectory.loss_mask.tolist(), trajectory.logprobs.tolist()


def without_call_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call ids carry a random per-episode prefix."""
    return [{k: v for k, v in m.items() if k != "tool_call_id"} for m in messages]


async def whole_history_episode(model: SGLangModel) -> None:
    """The agent loop without Strands: every call gets the whole history (no middleware runs)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"text": PROMPT}]}]
    for _ in range(len(SCRIPT[0]["replies"])):
        stop: Any = None
        async for event in process_stream(model.stream(messages, [execute_python_code.tool_spec], None)):
            if isinstance(event, ModelStopReason):
                stop = event
        assert stop is not None
        stop_reason, message, _usage, _metrics = stop["stop"]
        messages.append(message)
        uses = [block["toolUse"] for block in message["content"] if "toolUse" in block]
        if stop_reason != "tool_use":
            return
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "toolResult": {
                            "toolUseId": use["toolUseId"],
                            "status": "success",
                            "content": [{"text": tool_output(use["input"]["code"])}],
                        }
                    }
                    for use in uses
                ],
            }
        )
    raise AssertionError("the episode did not end")


async def test_agent_sends_only_new_messages_and_tokens_match_whole_history(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = make_agent(model)
    sent: list[int] = []

    async def record(context: Any, next_fn: Any) -> AsyncIterator[Any]:
        sent.append(len(context.messages))
        async for event in next_fn(context):
            yield event

    agent.add_middleware(InvokeModelStage, record)  # Wrap runs after every Input handler
    result = await agent.invoke_async(PROMPT)
    assert result.stop_reason == "end_turn"
    # The first call has the prompt; each later one the last output and the tool results.
    assert sent == [1, 2, 2, 2]
    assert len(agent.messages) == 8, "the agent keeps its whole history"

    reference = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    await whole_history_episode(reference)
    assert trajectory_lists(model) == trajectory_lists(reference)
    assert without_call_ids(model.transcript()) == without_call_ids(reference.transcript())


async def test_without_its_plugin_the_model_stays_exact_and_says_once_what_it_misses(
    qwen3_tokenizer: Any, client: SGLangClient, caplog: pytest.LogCaptureFixture
) -> None:
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = Agent(
        model=model,
        tools=[execute_python_code],
        callback_handler=None,
        conversation_manager=NullConversationManager(),
        retry_strategy=None,
    )
    with caplog.at_level(logging.WARNING, logger="strands_slime.provider.model"):
        await agent.invoke_async(PROMPT)
    warnings = [r for r in caplog.records if "without its plugin" in r.getMessage()]
    assert len(warnings) == 1 and "plugins=[model.plugin()]" in warnings[0].getMessage()
    reference = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    await make_agent(reference).invoke_async(PROMPT)
    assert trajectory_lists(model) == trajectory_lists(reference)
    another = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    with caplog.at_level(logging.WARNING, logger="strands_slime.provider.model"):
        await Agent(model=another, tools=[execute_python_code], callback_handler=None).invoke_async(PROMPT)
    warnings = [r for r in caplog.records if "without its plugin" in r.getMessage()]
    assert len(warnings) == 1, "once per process, not once per model (a model per episode)"


async def test_building_and_running_a_model_changes_no_global_state(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    import gc
    import sys

    from strands.telemetry.tracer import Tracer

    before = (list(sys.meta_path), Tracer._add_event_messages, gc.get_threshold(), gc.get_freeze_count())
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    await make_agent(model).invoke_async(PROMPT)
    after = (list(sys.meta_path), Tracer._add_event_messages, gc.get_threshold(), gc.get_freeze_count())
    assert after == before


async def test_a_middleware_that_restores_the_whole_history_is_followed(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    """Another middleware may replace the messages after ours: the model then reads them as a whole
    history (no stale offset)."""
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = make_agent(model)
    sent: list[int] = []

    async def restore(context: Any, next_fn: Any) -> AsyncIterator[Any]:
        context = context.replace(messages=copy.deepcopy(context.agent.messages))
        sent.append(len(context.messages))
        async for event in next_fn(context):
            yield event

    agent.add_middleware(InvokeModelStage, restore)
    await agent.invoke_async(PROMPT)
    assert sent == [1, 3, 5, 7]

    reference = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    await whole_history_episode(reference)
    assert trajectory_lists(model) == trajectory_lists(reference)
    assert model.stats.rolled_back_turns == 0


async def test_a_recording_span_keeps_the_whole_history(qwen3_tokenizer: Any, client: SGLangClient) -> None:
    """With OpenTelemetry recording, Strands' model-call span should list every message: the
    middleware then leaves the call's messages whole."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from strands.middleware import InvokeModelContext

    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = make_agent(model)
    await agent.invoke_async(PROMPT)
    messages = copy.deepcopy(agent.messages[:-1])  # as before the last model call

    def context() -> InvokeModelContext:
        return InvokeModelContext(
            agent=agent,
            messages=messages,
            system_prompt=None,
            tool_specs=[],
            tool_choice=None,
            invocation_state={},
            model=model,
        )

    plugin = model.plugin()
    trimmed = plugin.send_only_new_messages(context())
    assert trimmed.messages == messages[-2:]
    span = TracerProvider().get_tracer("test").start_span("recording")  # not installed globally
    assert span.is_recording()
    with trace.use_span(span, end_on_exit=True):
        whole = plugin.send_only_new_messages(context())
    assert whole.messages is messages and model.history.cut is None


def test_the_plugin_registers_its_hooks_through_the_agents_public_api(qwen3_tokenizer: Any) -> None:
    """No ``@hook`` for Strands to discover and no Strands private attribute set from outside: the hooks
    and the middleware are registered in ``init_agent`` with ``agent.add_hook``/``add_middleware``, and
    the plugin keeps no bound method of its own (no reference cycle with its model)."""
    model = SGLangModel(tokenizer=qwen3_tokenizer, base_url="http://127.0.0.1:9")
    plugin = model.plugin()
    assert plugin.hooks == [] and plugin.tools == []
    assert set(vars(plugin)) == {"model"}, "no attribute of Strands' Plugin set from outside"
    from strands.plugins._discovery import discover_hooks, discover_tools

    assert discover_hooks(plugin, plugin.name) == [] and discover_tools(plugin, plugin.name) == [], (
        "nothing for Plugin.__init__'s discovery to find, so skipping it loses nothing"
    )
    # what the hooks do (a malformed call answered, an edited history found) is tested with real agents
