"""Strands features an RL user combines with SGLangModel: each one works exactly (the trajectory is what
a fresh, uninterrupted episode would produce for that history: ids as sampled, masks right) or stops
with one error naming the cause and the fix. Real Strands agents and conversation managers, the real
Qwen3 tokenizer, HTTP to the dev server (on its own loop: Strands waits for a summary synchronously)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from helpers import SUMMARY, counting_script
from strands import Agent
from strands.agent.conversation_manager import (
    SlidingWindowConversationManager,
    SummarizingConversationManager,
)
from strands.hooks import BeforeModelCallEvent
from strands.types.exceptions import ContextWindowOverflowException, MaxTokensReachedException
from strands_agents import as_lists, execute_python_code, make_agent, quick_client
from threaded_app import devserver_in_thread

from benchmarks.devserver_reference import scripted_output_logprobs
from strands_slime.devserver import DevServer
from strands_slime.errors import (
    ContextLimitExceeded,
    ModelInUseError,
    TrajectoryDesyncError,
    find_episode_end,
)
from strands_slime.provider.client import SGLangClient
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.trajectory import TokenTrajectory, mask_runs

pytestmark = pytest.mark.unit

COUNT_TO = 4
PROMPT = "Count to four, one number per call."


@pytest.fixture(scope="module")
def server() -> Iterator[DevServer]:
    with devserver_in_thread("scripted", script=counting_script()) as running:
        yield running


@pytest.fixture
async def client(server: DevServer) -> AsyncIterator[SGLangClient]:
    client = quick_client(server.url)
    yield client
    await client.close()


def turns_of(trajectory: TokenTrajectory, turns: int) -> tuple[list[int], list[int], list[float]]:
    """The first ``turns`` turns of ``trajectory`` as lists."""
    end = trajectory.turn_start(turns).token_count if turns < trajectory.turn_count else len(trajectory)
    ids, mask, logprobs = as_lists(trajectory)
    return ids[:end], mask[:end], logprobs[:end]


def outputs_as_sampled(trajectory: TokenTrajectory, tokenizer: Any) -> list[str]:
    """The text of each output; each is checked to carry the logprobs the scripted server sampled it
    with after exactly the tokens before it (so it was sampled in this very context)."""
    texts = []
    ids = trajectory.token_ids.tolist()
    for value, start, end in mask_runs(trajectory.loss_mask):
        if value == 1:
            expected = scripted_output_logprobs(ids[:start], ids[start:end])
            assert trajectory.logprobs[start:end].tolist() == pytest.approx(expected)
            texts.append(tokenizer.decode(ids[start:end]))
    return texts


async def reference_episode(
    tokenizer: Any, client: SGLangClient, server: DevServer
) -> tuple[SGLangModel, list[int]]:
    """The uninterrupted episode, and each request's prompt length."""
    server.clear_request_log()
    model = SGLangModel(tokenizer=tokenizer, client=client)
    result = await make_agent(model).invoke_async(PROMPT)
    assert result.stop_reason == "end_turn" and model.trajectory.num_outputs == COUNT_TO + 1
    lengths = [len(entry["json"]["input_ids"]) for entry in server.request_log]
    server.clear_request_log()
    return model, lengths


# ---------------------------------------------------------------------- SummarizingConversationManager


async def summarizing_episode(
    tokenizer: Any, client: SGLangClient, server: DevServer, *, fanout: bool
) -> tuple[SGLangModel, Agent, SGLangModel, BaseException | None]:
    """The counting episode with a context window that overflows at the fourth call (its prompt leaves
    less than min_reply_tokens), so Strands' SummarizingConversationManager summarizes with the
    agent's own model."""
    reference, prompt_lengths = await reference_episode(tokenizer, client, server)
    min_reply = 32
    model = SGLangModel(
        tokenizer=tokenizer,
        client=client,
        new_segment_on_context_change=fanout,
        context_window_limit=prompt_lengths[3] + min_reply - 1,
        min_reply_tokens=min_reply,
    )
    manager = SummarizingConversationManager(
        summary_ratio=0.5, preserve_recent_messages=2, summarization_system_prompt="Summarize."
    )
    agent = make_agent(model, conversation_manager=manager)
    error: BaseException | None = None
    try:
        await agent.invoke_async(PROMPT)
    except Exception as exc:
        error = exc
    return model, agent, reference, error


async def test_a_summary_never_enters_the_trajectory_and_one_trajectory_refuses_the_compacted_history(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer
) -> None:
    model, agent, reference, error = await summarizing_episode(qwen3_tokenizer, client, server, fanout=False)
    assert model.stats.side_calls >= 1, "the summary was asked of the agent's own model"
    assert agent.messages[0]["content"][0]["text"].endswith(SUMMARY), "and the agent kept it"
    assert isinstance(error, TrajectoryDesyncError)
    message = str(error)
    assert "SummarizingConversationManager" in message and "new_segment_on_context_change=True" in message
    # Nothing rolled back, nothing of the summary recorded: exactly the uninterrupted episode's turns.
    assert model.stats.rolled_back_turns == 0
    assert as_lists(model.trajectory) == turns_of(reference.trajectory, model.trajectory.turn_count)
    assert model.trajectory.turn_count == 3
    assert SUMMARY not in qwen3_tokenizer.decode(model.trajectory.token_ids.tolist())


async def test_fanout_compaction_by_summaries_gives_one_exact_segment_per_context(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer
) -> None:
    model, agent, reference, error = await summarizing_episode(qwen3_tokenizer, client, server, fanout=True)
    assert error is None
    segments = [*model.closed_trajectories, model.trajectory]
    assert len(segments) >= 2 and model.stats.side_calls == len(segments) - 1
    # The first segment is the uninterrupted episode up to the overflow, turn for turn.
    first = segments[0]
    assert as_lists(first) == turns_of(reference.trajectory, first.turn_count)
    # No turn missing, none twice, the summary never trained: the outputs over all segments are the
    # uninterrupted episode's, each sampled in the context its segment holds.
    outputs = [text for segment in segments for text in outputs_as_sampled(segment, qwen3_tokenizer)]
    assert outputs == outputs_as_sampled(reference.trajectory, qwen3_tokenizer)
    assert all(SUMMARY not in text for text in outputs)
    # Each later segment starts with the compacted history rendered as a prompt (mask 0): the summary
    # as the user message the agent holds.
    last = segments[-1]
    prompt = qwen3_tokenizer.decode(last.token_ids[: last.initial_prompt_length].tolist())
    assert SUMMARY in prompt and PROMPT not in prompt
    position = model.history.outputs[0].position  # the last segment's first output in agent.messages
    assert agent.messages[0]["content"][0]["text"].endswith(SUMMARY)
    assert model.lane.first_prompt_ids == last.token_ids[: last.initial_prompt_length]
    expected_prompt = await model.initial_prompt_ids(
        agent.messages[:position], [execute_python_code.tool_spec], agent.system_prompt
    )
    assert last.token_ids[: last.initial_prompt_length] == expected_prompt, "a fresh episode's prompt"


LONG_HISTORY = [
    message
    for k in range(6)
    for message in (
        {"role": "user", "content": [{"text": f"Earlier question {k}: say a number."}]},
        {"role": "assistant", "content": [{"text": f"The number is {k}."}]},
    )
]


@pytest.mark.parametrize("fanout", [False, True], ids=["one-trajectory", "fanout"])
async def test_a_summary_before_the_first_call_is_a_side_call(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer, fanout: bool
) -> None:
    """Strands' own pattern: ``conversation_manager.reduce_context(agent)`` on a long
    ``Agent(messages=...)`` before its first invocation. The summary is asked of the agent's model
    before the agent loop has called it: it is a side call all the same (the plugin bound the model to
    its agent), never the episode's first turn, with or without fan-out."""
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, new_segment_on_context_change=fanout)
    manager = SummarizingConversationManager(summary_ratio=0.5, preserve_recent_messages=2)
    agent = make_agent(model, conversation_manager=manager, messages=[dict(m) for m in LONG_HISTORY])
    manager.reduce_context(agent)
    assert model.stats.side_calls == 1 and model.trajectory.num_outputs == 0
    assert SUMMARY in json.dumps(agent.messages[0])
    await agent.invoke_async(PROMPT)
    assert model.closed_trajectories == [], "nothing before the episode's first turn"
    texts = outputs_as_sampled(model.trajectory, qwen3_tokenizer)
    assert len(texts) == COUNT_TO + 1 and not any(SUMMARY in text for text in texts)
    assert model.stats.side_calls == 1 and model.stats.model_calls == COUNT_TO + 1


async def test_summaries_on_a_model_of_their_own_leave_the_episode_untouched(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer
) -> None:
    """``Agent(aux_model=...)`` takes the summaries: the episode's model serves none of them, and its
    segments are the same as when it serves them itself."""
    served, _, _, _ = await summarizing_episode(qwen3_tokenizer, client, server, fanout=True)
    _, prompt_lengths = await reference_episode(qwen3_tokenizer, client, server)
    model = SGLangModel(
        tokenizer=qwen3_tokenizer,
        client=client,
        new_segment_on_context_change=True,
        context_window_limit=prompt_lengths[3] + 31,
        min_reply_tokens=32,
    )
    summarizer = SGLangModel(tokenizer=qwen3_tokenizer, client=client, new_segment_on_context_change=True)
    manager = SummarizingConversationManager(
        summary_ratio=0.5, preserve_recent_messages=2, summarization_system_prompt="Summarize."
    )
    await make_agent(model, conversation_manager=manager, aux_model=summarizer).invoke_async(PROMPT)
    assert model.stats.side_calls == 0 and summarizer.stats.model_calls == served.stats.side_calls >= 2
    segments = [*model.closed_trajectories, model.trajectory]
    assert [as_lists(t) for t in segments] == [
        as_lists(t) for t in [*served.closed_trajectories, served.trajectory]
    ]


async def test_proactive_compression_sees_exact_counts_and_gives_exact_segments(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer
) -> None:
    """SummarizingConversationManager(proactive_compression=...) compacts before a call once the
    projected prompt (exact here) reaches its share of the context window."""
    reference, prompt_lengths = await reference_episode(qwen3_tokenizer, client, server)
    limit = int(prompt_lengths[3] / 0.7)  # the fourth call reaches 70 % of the window, the third does not
    assert prompt_lengths[2] < 0.7 * limit <= prompt_lengths[3]
    model = SGLangModel(
        tokenizer=qwen3_tokenizer,
        client=client,
        new_segment_on_context_change=True,
        context_window_limit=limit,
        min_reply_tokens=16,
    )
    manager = SummarizingConversationManager(
        summary_ratio=0.5,
        preserve_recent_messages=2,
        summarization_system_prompt="Summarize.",
        proactive_compression={"compression_threshold": 0.7},
    )
    agent = make_agent(model, conversation_manager=manager)
    await agent.invoke_async(PROMPT)
    segments = [*model.closed_trajectories, model.trajectory]
    assert len(segments) >= 2 and model.stats.side_calls == len(segments) - 1
    assert as_lists(segments[0]) == turns_of(reference.trajectory, 3)
    outputs = [text for segment in segments for text in outputs_as_sampled(segment, qwen3_tokenizer)]
    assert outputs == outputs_as_sampled(reference.trajectory, qwen3_tokenizer)


# ---------------------------------------------------------------------- one model, two agents


async def test_a_model_held_by_one_agent_refuses_another_used_in_turn(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    await make_agent(model).invoke_async(PROMPT)
    before = as_lists(model.trajectory)
    with pytest.raises(ModelInUseError, match=r"one model serves one agent.*model\.reset\(\)"):
        await make_agent(model).invoke_async("Say hi")
    assert as_lists(model.trajectory) == before, "the first agent's trajectory is kept"
    model.reset()  # hand it on explicitly: a new episode
    result = await make_agent(model).invoke_async("Say hi")
    assert result.stop_reason == "end_turn" and model.trajectory.num_outputs == 1


async def test_a_model_held_by_one_agent_refuses_another_used_concurrently(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer
) -> None:
    reference, _ = await reference_episode(qwen3_tokenizer, client, server)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    outcomes = await asyncio.gather(
        make_agent(model).invoke_async(PROMPT), make_agent(model).invoke_async(PROMPT), return_exceptions=True
    )
    assert sum(isinstance(o, ModelInUseError) for o in outcomes) == 1
    assert sum(getattr(o, "stop_reason", None) == "end_turn" for o in outcomes) == 1
    assert as_lists(model.trajectory) == as_lists(reference.trajectory), "the episode that ran is exact"


# ---------------------------------------------------------------------- edits to agent.messages


async def two_invocations(tokenizer: Any, client: SGLangClient, **options: Any) -> tuple[SGLangModel, Agent]:
    model = SGLangModel(tokenizer=tokenizer, client=client, **options)
    agent = make_agent(model)
    await agent.invoke_async(PROMPT)
    return model, agent


async def test_an_edit_before_the_last_output_is_one_error_naming_the_fix(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer
) -> None:
    model, agent = await two_invocations(qwen3_tokenizer, client)
    before = as_lists(model.trajectory)
    agent.messages[2]["content"][0]["toolResult"]["content"] = [{"text": "2 (edited)"}]
    requests = len(server.request_log)
    with pytest.raises(TrajectoryDesyncError, match=r"agent\.messages\[2\].*model\.reset\(\)"):
        await agent.invoke_async("Say hi")
    assert len(server.request_log) == requests, "nothing was sent"
    assert as_lists(model.trajectory) == before


@pytest.mark.parametrize("same_prompt", [False, True], ids=["new-prompt", "same-prompt"])
async def test_clearing_the_history_never_rolls_the_trajectory_back(
    qwen3_tokenizer: Any, client: SGLangClient, same_prompt: bool
) -> None:
    model, agent = await two_invocations(qwen3_tokenizer, client)
    before = as_lists(model.trajectory)
    agent.messages.clear()
    with pytest.raises(TrajectoryDesyncError, match=r"cleared.*model\.reset\(\)"):
        await agent.invoke_async(PROMPT if same_prompt else "Say hi")
    assert as_lists(model.trajectory) == before and model.stats.rolled_back_turns == 0


async def test_with_fanout_an_edited_history_starts_a_new_segment(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    model, agent = await two_invocations(qwen3_tokenizer, client, new_segment_on_context_change=True)
    before = as_lists(model.trajectory)
    agent.messages[2]["content"][0]["toolResult"]["content"] = [{"text": "2 (edited)"}]
    await agent.invoke_async("Say hi")
    assert len(model.closed_trajectories) == 1 and as_lists(model.closed_trajectories[0]) == before
    prompt = qwen3_tokenizer.decode(
        model.trajectory.token_ids[: model.trajectory.initial_prompt_length].tolist()
    )
    assert "2 (edited)" in prompt, "the model reads the edited history from now on"
    assert model.trajectory.num_outputs == 1


async def test_an_output_the_agent_cancelled_leaves_the_trajectory(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    """agent.cancel() while the reply streams: Strands keeps "Cancelled by user" instead of the output,
    so that turn leaves the trajectory and the next call reads what the agent holds."""
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    cancel = {"armed": True}

    def callback(**event: Any) -> None:
        if "data" in event and cancel["armed"]:
            cancel["armed"] = False
            agent.cancel()

    agent = make_agent(model, callback_handler=callback)
    result = await agent.invoke_async("Say hi")
    assert result.stop_reason == "cancelled" and agent.messages[-1]["content"] == [
        {"text": "Cancelled by user"}
    ]
    await agent.invoke_async("Say hi")
    assert model.stats.rolled_back_turns == 1 and model.trajectory.num_outputs == 1
    reference = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    await make_agent(reference, messages=json.loads(json.dumps(agent.messages[:3]))).invoke_async()
    assert as_lists(model.trajectory)[0] == as_lists(reference.trajectory)[0], "a fresh episode's ids"


# ---------------------------------------------------------------------- context signals


async def test_overflow_is_signalled_while_a_reply_still_has_room_to_be_useful(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer
) -> None:
    reference, _ = await reference_episode(qwen3_tokenizer, client, server)
    first_prompt = reference.trajectory.initial_prompt_length
    capped = SGLangModel(tokenizer=qwen3_tokenizer, client=client, context_window_limit=first_prompt + 20)
    with pytest.raises(MaxTokensReachedException):  # the reply is cut at the 20 tokens left
        await make_agent(capped).invoke_async(PROMPT)
    assert server.request_log[0]["json"]["sampling_params"]["max_new_tokens"] == 20, (
        "Null manager: no minimum"
    )
    server.clear_request_log()
    model = SGLangModel(
        tokenizer=qwen3_tokenizer, client=client, context_window_limit=first_prompt + 20, min_reply_tokens=21
    )
    with pytest.raises(
        ContextLimitExceeded, match=r"leaving 20 for the reply; it needs 21 \(min_reply_tokens\)"
    ):
        await make_agent(model).invoke_async(PROMPT)
    assert server.request_log == [], "signalled before anything is sent"


async def test_a_compacting_agent_gets_the_overflow_before_its_reply_is_squeezed(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer
) -> None:
    """With a conversation manager that can compact, the default minimum room is 1024 tokens (or a
    quarter of the window): the overflow reaches the manager (here a sliding window, which cannot
    shrink a lone prompt) instead of the model writing a squeezed reply."""
    long_prompt = PROMPT + " Take your time." * 800
    probe = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    prompt_length = len(
        await probe.initial_prompt_ids(
            [{"role": "user", "content": [{"text": long_prompt}]}], [execute_python_code.tool_spec], None
        )
    )
    assert prompt_length + 1000 >= 4 * 1024, "a window where the default minimum is 1024"
    server.clear_request_log()
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, context_window_limit=prompt_length + 1000)
    manager = SlidingWindowConversationManager(window_size=40)
    with pytest.raises(ContextWindowOverflowException, match="Unable to trim") as info:
        await make_agent(model, conversation_manager=manager).invoke_async(long_prompt)
    signalled = find_episode_end(info.value)
    assert isinstance(signalled, ContextLimitExceeded)
    assert "leaving 1000 for the reply; it needs 1024" in str(signalled)
    assert server.request_log == []


async def test_count_tokens_equals_the_tokenizer_for_every_content_type(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    tool_spec = execute_python_code.tool_spec
    messages: list[Any] = [
        {"role": "user", "content": [{"text": "Compute."}, {"text": "Then say it."}]},
        {
            "role": "assistant",
            "content": [
                {"reasoningContent": {"reasoningText": {"text": "I will run it."}}},
                {
                    "toolUse": {
                        "toolUseId": "t1",
                        "name": "execute_python_code",
                        "input": {"code": "print(2)"},
                    }
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "t1",
                        "status": "success",
                        "content": [{"json": {"value": 2, "ok": True}}],
                    }
                }
            ],
        },
        {"role": "assistant", "content": [{"text": "It is 2."}]},
        {"role": "user", "content": [{"text": "Thanks, and again?"}]},
    ]
    expected_messages = [
        {"role": "system", "content": "Be brief.\nUse tools."},
        {"role": "user", "content": "Compute.\nThen say it."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I will run it.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "execute_python_code", "arguments": {"code": "print(2)"}},
                }
            ],
        },
        {"role": "tool", "content": json.dumps({"value": 2, "ok": True})},
        {"role": "assistant", "content": "It is 2."},
        {"role": "user", "content": "Thanks, and again?"},
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": tool_spec["name"],
                "description": tool_spec["description"],
                "parameters": tool_spec["inputSchema"]["json"],
            },
        }
    ]
    system_blocks: list[Any] = [
        {"text": "Be brief."},
        {"cachePoint": {"type": "default"}},
        {"text": "Use tools."},
    ]

    def tokenizer_count(conversation: list[dict[str, Any]], needle: str) -> int:
        text = qwen3_tokenizer.apply_chat_template(
            conversation, tools=tools, add_generation_prompt=True, tokenize=False
        )
        assert needle in text
        return len(qwen3_tokenizer.encode(text, add_special_tokens=False))

    counted = await model.count_tokens(
        messages,
        tool_specs=[tool_spec],
        system_prompt="ignored: the content blocks win, as in Strands",
        system_prompt_content=system_blocks,
    )
    assert counted == tokenizer_count(expected_messages, '"value": 2')
    # Up to the tool result, the reasoning is the latest turn's: Qwen3's template renders it.
    in_turn = await model.count_tokens(
        messages[:3], tool_specs=[tool_spec], system_prompt_content=system_blocks
    )
    assert in_turn == tokenizer_count(expected_messages[:4], "<think>\nI will run it.\n</think>")
    assert await model.count_tokens(messages) < counted, "without tools or system prompt"
    assert await model.count_tokens([]) == 0


async def test_projected_input_tokens_are_exact_before_every_call(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer
) -> None:
    """Strands projects each call's prompt size from the last output's usage plus count_tokens of the
    messages after it: with TITO that is exactly the request's length."""
    server.clear_request_log()
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    projected: list[int | None] = []
    agent = make_agent(model)
    agent.add_hook(lambda event: projected.append(event.projected_input_tokens), BeforeModelCallEvent)
    await agent.invoke_async(PROMPT)
    assert projected == [len(entry["json"]["input_ids"]) for entry in server.request_log]


async def test_a_hook_that_rewrites_a_tool_input_changes_what_runs_not_what_is_trained(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer
) -> None:
    """Decided and documented (docs/provider.md, "What is trained"): the trajectory holds what the model
    sampled; a ``BeforeToolCallEvent`` hook that rewrites a call's input (a guard, a sanitizer) changes
    what the tool runs and what ``agent.messages`` shows, not the trained tokens. The episode goes on
    exactly, with no refusal, and the next prompt is the tool's result of the rewritten call."""
    from strands.hooks import BeforeToolCallEvent

    reference, _ = await reference_episode(qwen3_tokenizer, client, server)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = make_agent(model)
    rewritten: list[str] = []

    def sanitize(event: BeforeToolCallEvent) -> None:
        if not rewritten:
            rewritten.append(event.tool_use["input"]["code"])
            event.tool_use["input"] = {"code": "print( 1 )"}  # another text, the same result

    agent.add_hook(sanitize, BeforeToolCallEvent)
    await agent.invoke_async(PROMPT)
    assert rewritten == ["print(1)"], "the hook saw the sampled call"
    assert as_lists(model.trajectory) == as_lists(reference.trajectory), "the sampled tokens are trained"
    first_call = next(b["toolUse"] for b in agent.messages[1]["content"] if "toolUse" in b)
    assert first_call["input"] == {"code": "print( 1 )"}, "agent.messages shows the input that ran"
