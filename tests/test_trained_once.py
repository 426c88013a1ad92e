"""Every token the policy sampled is trained exactly once, and nothing else: a property over random
sequences of the Strands features an RL agent combines (summaries before and between invocations, a
sliding window, a session restore into a new model, a hook that rewrites a tool's input, cancels,
the deprecated structured output), with and without fan-out.

What the server sampled is read off the client (every ``/generate`` reply, with the ids it was sent),
and each sampled output must be exactly one of:

* **trained**: in exactly one segment of the episode's record, with mask 1, right after the very ids it
  was sampled from (the scripted server's logprobs, a function of the context, prove it);
* **a side call** the configuration leaves untrained (a conversation manager's summary, the deprecated
  ``Agent.structured_output``): counted in ``stats.side_calls`` and ``side_call_tokens``;
* **discarded by the agent**: a call Strands ran again, or a reply ``agent.cancel()`` dropped.

Nothing else has mask 1, and each segment's first prompt is a fresh render of the history it starts.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import SUMMARY, counting_script
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from strands.agent.conversation_manager import (
    NullConversationManager,
    SlidingWindowConversationManager,
    SummarizingConversationManager,
)
from strands.hooks import BeforeModelCallEvent, BeforeToolCallEvent
from strands_agents import make_agent
from threaded_app import devserver_in_thread

from benchmarks.devserver_reference import scripted_output_logprobs
from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangClient
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.trajectory import TokenTrajectory, mask_runs

pytestmark = pytest.mark.slow

OPERATIONS = ("count", "hi", "summarize", "window", "restore", "rewrite_input", "cancel", "structured")


LONG_HISTORY = [
    message
    for k in range(4)
    for message in (
        {"role": "user", "content": [{"text": f"Earlier question {k}: say a number."}]},
        {"role": "assistant", "content": [{"text": f"The number is {k}."}]},
    )
]


class Greeting(BaseModel):
    text: str


class RecordingClient(SGLangClient):
    """The real client, keeping what each ``/generate`` reply sampled and the ids it was sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sampled: list[tuple[list[int], list[int]]] = []

    async def generate(self, input_ids: Any, *args: Any, **kwargs: Any) -> Any:
        sent = list(input_ids)
        response = await super().generate(input_ids, *args, **kwargs)
        if response.output_ids:
            self.sampled.append((sent, list(response.output_ids)))
        return response


@pytest.fixture(scope="module")
def server() -> Iterator[DevServer]:
    script = counting_script()
    script.insert(0, {"match": "Greeting", "replies": ['{"text": "hi"}']})
    with devserver_in_thread("scripted", script=script) as running:
        yield running


def fresh_model(tokenizer: Any, client: SGLangClient, fanout: bool) -> SGLangModel:
    return SGLangModel(
        tokenizer=tokenizer, client=client, new_segment_on_context_change=fanout, persist_tokens=True
    )


class Episode:
    """One agent driven through ``operations``; the model may be replaced by a session restore."""

    def __init__(
        self, tokenizer: Any, client: RecordingClient, fanout: bool, manager: str, history: Any
    ) -> None:
        self.tokenizer, self.client, self.fanout = tokenizer, client, fanout
        self.manager = {
            "null": NullConversationManager,
            "window": lambda: SlidingWindowConversationManager(window_size=6, should_truncate_results=False),
            "summarize": lambda: SummarizingConversationManager(
                summary_ratio=0.5, preserve_recent_messages=2
            ),
        }[manager]
        self.discarded = 0
        """Replies the agent dropped (cancelled calls) on models no longer in use, plus rolled back turns."""
        self.side_calls = 0
        self.side_call_tokens = 0
        self.rewrites = 0
        self.cancel_next = False
        self.model = fresh_model(tokenizer, client, fanout)
        self.agent = self.build(
            self.model, messages=[dict(m) for m in history] if history else None, state=None
        )

    def build(self, model: SGLangModel, messages: Any, state: Any) -> Any:
        agent = make_agent(
            model,
            conversation_manager=self.manager(),
            **({"messages": messages} if messages is not None else {}),
            **({"state": state} if state is not None else {}),
        )
        agent.add_hook(self.maybe_rewrite, BeforeToolCallEvent)
        agent.add_hook(self.maybe_cancel, BeforeModelCallEvent)
        return agent

    def maybe_rewrite(self, event: BeforeToolCallEvent) -> None:
        if self.rewrites:
            self.rewrites -= 1
            event.tool_use["input"] = {"code": "print(1)"}  # a guard that sanitizes the call

    def maybe_cancel(self, event: BeforeModelCallEvent) -> None:
        if self.cancel_next:
            self.cancel_next = False
            event.agent.cancel()

    def retire(self) -> None:
        """The model leaves the episode (a restore replaced it): keep its untrained counts."""
        self.side_calls += self.model.stats.side_calls
        self.side_call_tokens += self.model.stats.side_call_tokens
        self.discarded += self.model.stats.rolled_back_turns

    async def apply(self, operation: str) -> None:
        agent = self.agent
        if operation in ("count", "hi", "cancel", "rewrite_input"):
            self.cancel_next = operation == "cancel"
            self.rewrites = 1 if operation == "rewrite_input" else 0
            prompt = "Say hi." if operation == "hi" else "Count to four, one number per call."
            try:
                await agent.invoke_async(prompt)
            except Exception as exc:  # a refusal must name its cause: one trajectory, compacted history
                assert not self.fanout and "new_segment_on_context_change" in str(exc), exc
                raise Refused from exc
        elif operation == "summarize" and isinstance(
            agent.conversation_manager, SummarizingConversationManager
        ):
            if len(agent.messages) > 3:
                await asyncio.to_thread(agent.conversation_manager.reduce_context, agent)
        elif operation == "window" and len(agent.messages) > 3:
            agent.conversation_manager.apply_management(agent)
        elif operation == "structured":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # the deprecated call, on purpose
                await agent.structured_output_async(Greeting, "Greeting please")
        elif operation == "restore":
            snapshot = agent.take_snapshot(preset="session")
            self.retire()
            self.model = fresh_model(self.tokenizer, self.client, self.fanout)
            self.agent = self.build(self.model, messages=None, state=None)
            self.agent.load_snapshot(snapshot)


class Refused(Exception):
    """One trajectory refused a compacted history (the documented refusal without fan-out)."""


def outputs_in_context(segment: TokenTrajectory) -> list[tuple[list[int], list[int]]]:
    """Each output run of ``segment`` with the ids before it, checked to carry the logprobs the scripted
    server sampled it with after exactly those ids."""
    ids = segment.token_ids.tolist()
    found = []
    for value, start, end in mask_runs(segment.loss_mask):
        if value == 1:
            assert segment.logprobs[start:end].tolist() == pytest.approx(
                scripted_output_logprobs(ids[:start], ids[start:end])
            ), "an output sits in another context than the one it was sampled in"
            found.append((ids[:start], ids[start:end]))
    return found


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(fanout=True, manager="summarize", history=True, operations=["summarize"])
@example(fanout=False, manager="summarize", history=True, operations=["summarize", "count"])
@given(
    fanout=st.booleans(),
    manager=st.sampled_from(["null", "window", "summarize"]),
    history=st.booleans(),
    operations=st.lists(st.sampled_from(OPERATIONS), min_size=1, max_size=6),
)
def test_every_sampled_output_is_trained_once_or_left_out_by_design(
    qwen3_tokenizer: Any, server: DevServer, fanout: bool, manager: str, history: bool, operations: list[str]
) -> None:
    """``history``: the agent starts from a long ``Agent(messages=...)`` (a summary may come before its
    first call). The episode ends with an invocation: a restored model takes the episode over then."""
    setup = (fanout, manager, history)
    asyncio.run(_episode(qwen3_tokenizer, server, setup, [*operations, "hi"]))


async def _episode(
    tokenizer: Any, server: DevServer, setup: tuple[bool, str, bool], operations: list[str]
) -> None:
    fanout, manager, history = setup
    client = RecordingClient(server.url, retry_delay=0.01, max_retry_delay=0.05)
    try:
        episode = Episode(tokenizer, client, fanout, manager, LONG_HISTORY if history else None)
        for operation in operations:
            try:
                await episode.apply(operation)
            except Refused:
                return  # the refusal is the documented outcome; nothing was trained past it
        episode.retire()
        model = episode.model
        segments = model.lane.segments()
        trained = [pair for segment in segments for pair in outputs_in_context(segment)]
    finally:
        await client.close()

    # outputs sampled once each; the restore copies the earlier ones into the new model (not re-sampled)
    sampled = client.sampled
    found = [pair for pair in sampled if pair in trained]
    for pair in trained:
        assert sampled.count(pair) >= 1, "mask 1 on tokens the server never sampled there"
        assert trained.count(pair) == 1, "an output trained twice"
    assert not any(SUMMARY in tokenizer.decode(output) for _, output in trained), "a summary was trained"
    untrained = [pair for pair in sampled if pair not in trained]
    summaries = [pair for pair in untrained if SUMMARY in tokenizer.decode(pair[1])]
    structured = [pair for pair in untrained if '"text"' in tokenizer.decode(pair[1])]
    assert len(summaries) + len(structured) == episode.side_calls, (
        "every side call, and only those, untrained"
    )
    assert sum(len(p[1]) for p in summaries + structured) == episode.side_call_tokens
    cancelled = len(untrained) - episode.side_calls
    assert cancelled <= episode.discarded + operations.count("cancel"), (
        f"{cancelled} sampled output(s) neither trained, side calls nor discarded by the agent"
    )
    assert len(found) + len(untrained) == len(sampled)
    for segment in segments:
        segment.check()
    mask_ones = sum(segment.loss_mask.count(1) for segment in segments)
    assert mask_ones == sum(len(output) for _, output in trained), "mask 1 only on sampled outputs"
