"""Strands' tracer skips serializing the history for spans that do not record, and traces what it
did before for spans that do."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from strands import Agent
from strands.agent.conversation_manager import NullConversationManager
from strands.telemetry.tracer import Tracer

from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangClient
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.telemetry import (
    messages_of_unrecorded_spans_skipped,
    skip_messages_of_unrecorded_spans,
)

pytestmark = pytest.mark.unit

MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": [{"text": "What is 6*7?"}]},
    {
        "role": "assistant",
        "content": [
            {
                "toolUse": {
                    "toolUseId": "call-1",
                    "name": "execute_python_code",
                    "input": {"code": "print(6*7)"},
                }
            }
        ],
    },
    {
        "role": "user",
        "content": [
            {"toolResult": {"toolUseId": "call-1", "status": "success", "content": [{"text": "42"}]}}
        ],
    },
]


class UntouchableMessages(list):  # type: ignore[type-arg]
    """A history that fails the test when anything reads it."""

    def __iter__(self) -> Any:
        raise AssertionError("the history was read for a span that does not record")

    def __len__(self) -> int:
        raise AssertionError("the history was read for a span that does not record")


def recording_tracer() -> tuple[Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = Tracer()
    tracer.tracer = provider.get_tracer("strands-test")  # this tracer only; nothing installed globally
    return tracer, exporter


async def test_a_model_changes_no_global_state_and_the_rollout_turns_the_skip_on(
    qwen3_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Building and running a plain model leaves Strands' tracer as it ships; the rollout's episode
    opts in (explicitly, for verified Strands releases only)."""
    from types import SimpleNamespace

    from strands_slime.rollout.episode import generate
    from strands_slime.rollout.slime_compat import Sample

    shipped = getattr(Tracer._add_event_messages, "__wrapped__", Tracer._add_event_messages)
    monkeypatch.setattr(Tracer, "_add_event_messages", shipped)  # as Strands ships it, whatever ran before
    assert not messages_of_unrecorded_spans_skipped()
    server = await DevServer(
        backend="scripted", script=[{"match": "6*7", "replies": ["Answer: \\boxed{42}"]}]
    ).start()
    client = SGLangClient(server.url, retry_delay=0.01, max_retry_delay=0.05)
    try:
        model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
        agent = Agent(
            model=model,
            callback_handler=None,
            conversation_manager=NullConversationManager(),
            retry_strategy=None,
            plugins=[model.plugin()],
        )
        result = await agent.invoke_async("What is 6*7?")
        assert "42" in str(result)
        assert not messages_of_unrecorded_spans_skipped(), "a model or its plugin patches nothing"
        host, port = server.url.rsplit("//", 1)[1].split(":")
        args = SimpleNamespace(
            sglang_router_ip=host,
            sglang_router_port=int(port),
            strands_slime={"tokenizer_path": None, "tools": [], "gc_tuning": False},
            hf_checkpoint=None,
        )
        sample = await generate(args, Sample(prompt="What is 6*7?", index=0), {"max_new_tokens": 64})
        assert sample.status.name == "COMPLETED"
        assert messages_of_unrecorded_spans_skipped(), "the rollout's episode opts in"
    finally:
        await client.close()
        await server.stop()


def test_an_unverified_strands_release_is_left_as_it_ships(monkeypatch: pytest.MonkeyPatch) -> None:
    from strands_slime.provider import telemetry

    shipped = getattr(Tracer._add_event_messages, "__wrapped__", Tracer._add_event_messages)
    monkeypatch.setattr(Tracer, "_add_event_messages", shipped)
    monkeypatch.setattr(telemetry, "_strands_version", lambda: (2, 1))
    assert not skip_messages_of_unrecorded_spans()
    assert not messages_of_unrecorded_spans_skipped()


def test_a_span_that_does_not_record_never_reads_the_history() -> None:
    assert skip_messages_of_unrecorded_spans()
    tracer = Tracer()
    span = tracer.start_event_loop_cycle_span(invocation_state={}, messages=UntouchableMessages(MESSAGES))
    assert not span.is_recording()
    tracer._add_event_messages(None, UntouchableMessages(MESSAGES))


def test_a_recording_span_gets_what_strands_itself_records() -> None:
    assert skip_messages_of_unrecorded_spans()
    assert skip_messages_of_unrecorded_spans()  # a second call wraps nothing twice
    unguarded = Tracer._add_event_messages.__wrapped__  # type: ignore[attr-defined]
    assert not hasattr(unguarded, "__wrapped__")
    tracer, exporter = recording_tracer()

    guarded_span = tracer.start_event_loop_cycle_span(invocation_state={}, messages=MESSAGES)
    guarded_span.end()
    plain_span = tracer._start_span("execute_event_loop_cycle", None, {})
    unguarded(tracer, plain_span, MESSAGES)
    plain_span.end()

    guarded, plain = exporter.get_finished_spans()
    assert guarded.events or guarded.attributes
    recorded = [(event.name, dict(event.attributes or {})) for event in guarded.events]
    assert recorded == [(event.name, dict(event.attributes or {})) for event in plain.events]
    assert "print(6*7)" in str(recorded) + str(dict(guarded.attributes or {}))


def test_the_current_span_decides_not_a_global_switch() -> None:
    """Tracing switched on later (a recording span) is traced in full in the same process."""
    assert skip_messages_of_unrecorded_spans()
    tracer, exporter = recording_tracer()
    with trace.use_span(tracer._start_span("invoke_agent", None, {}), end_on_exit=True) as parent:
        child = tracer.start_event_loop_cycle_span(invocation_state={}, messages=MESSAGES, parent_span=parent)
        child.end()
    cycle = next(span for span in exporter.get_finished_spans() if span.name == "execute_event_loop_cycle")
    assert "What is 6*7?" in str([event.attributes for event in cycle.events]) + str(cycle.attributes)
