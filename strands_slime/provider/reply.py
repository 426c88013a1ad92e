"""A reply as Strands stream events, and the tool-call ids the episode gives out.

The model's output is parsed once (:func:`~strands_slime.provider.tool_parsers.parse_output`): reasoning,
visible text and tool calls become Strands' stream events. Each tool call of an episode turn gets an
id of ours (``call_<episode>_<n>``) in the order calls were made: the chat template renders calls and
results by that order, so a call id never depends on the text. A malformed call keeps the parser's
explanation, which the plugin answers it with instead of running the tool.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strands.types.exceptions import StructuredOutputException
from strands.types.streaming import StreamEvent
from strands.types.tools import ToolSpec

from strands_slime.provider.history import OutputRecord, output_signature
from strands_slime.provider.recorder import ModelStats
from strands_slime.provider.tool_parsers import THINK_CLOSE, ParsedOutput, ToolParser, parse_output


@dataclass(slots=True)
class ToolCallBook:
    """The episode's tool-call ids: their order, the model's own ids, and the malformed calls' answers."""

    order: dict[str, int] = field(default_factory=dict)
    native_ids: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    prefix: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def take_error(self, tool_use_id: str) -> str | None:
        """The explanation a malformed call gets instead of running (None for a valid call); taken once."""
        return self.errors.pop(tool_use_id, None)

    def state(self) -> dict[str, Any]:
        """The book as plain JSON (:meth:`from_state` reads it)."""
        return {
            "call_order": dict(self.order),
            "native_call_ids": dict(self.native_ids),
            "tool_errors": dict(self.errors),
            "id_prefix": self.prefix,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ToolCallBook:
        """The book :meth:`state` wrote."""
        return cls(
            {str(k): int(v) for k, v in state["call_order"].items()},
            {str(k): str(v) for k, v in state["native_call_ids"].items()},
            {str(k): str(v) for k, v in state["tool_errors"].items()},
            str(state["id_prefix"]),
        )


@dataclass(slots=True)
class Reply:
    """One parsed reply: what the history will hold of it and the chat-template view (the model keeps the
    latest; its stream events are handed out, not kept)."""

    text: str
    parsed: ParsedOutput
    finish: str
    signature: tuple[Any, ...]
    assistant: dict[str, Any]
    constraint: str | None = None
    """Where a constrained reply's reasoning is (``"open"``: before the JSON), None without a constraint."""


def reply(
    text: str,
    finish: str,
    tool_parser: ToolParser,
    tool_specs: list[ToolSpec] | None,
    opened_reasoning: bool,
    book: ToolCallBook | None,
    stats: ModelStats,
) -> tuple[Reply, list[StreamEvent]]:
    """The reply, and its Strands stream events (the usage event is the caller's). ``book`` gives an episode
    turn's tool calls their ids and records malformed ones; None for a side call (ids of its own, nothing
    recorded)."""
    parsed = parse_output(text, tool_parser, tool_specs, prompt_opened_reasoning=opened_reasoning)
    content: list[dict[str, Any]] = []
    events: list[StreamEvent] = [{"messageStart": {"role": "assistant"}}]
    if parsed.reasoning:
        events += _block({"reasoningContent": {"text": parsed.reasoning}})
        content.append({"reasoningContent": {"reasoningText": {"text": parsed.reasoning}}})
    calls = parsed.tool_calls if finish != "length" else []
    visible = parsed.text
    if finish == "length" and parsed.tool_calls:  # a call cut by the limit is text, not a call
        visible = "\n".join(part for part in (parsed.text, *(c.raw for c in parsed.tool_calls)) if part)
    if visible:
        events += _block({"text": visible})
        content.append({"text": visible})
    for number, call in enumerate(calls):
        if book is None:
            tool_use_id = f"side_{uuid.uuid4().hex[:8]}_{number}"
        else:
            tool_use_id = f"call_{book.prefix}_{len(book.order):04d}"
            book.order[tool_use_id] = len(book.order)
            if call.call_id:
                book.native_ids[tool_use_id] = call.call_id
            stats.tool_calls += 1
            if call.error is not None:
                stats.parse_errors += 1
                stats.parse_error_messages.append(call.error)
                book.errors[tool_use_id] = tool_parser.explain_error(call.error, call.raw)
        arguments = call.arguments if call.arguments is not None else {}
        events.append(
            {"contentBlockStart": {"start": {"toolUse": {"name": call.name, "toolUseId": tool_use_id}}}}
        )
        events.append(
            {
                "contentBlockDelta": {
                    "delta": {"toolUse": {"input": json.dumps(arguments, ensure_ascii=False)}}
                }
            }
        )
        events.append({"contentBlockStop": {}})
        content.append({"toolUse": {"toolUseId": tool_use_id, "name": call.name, "input": arguments}})
    assistant: dict[str, Any] = {"role": "assistant", "content": visible}
    if parsed.reasoning is not None:
        assistant["reasoning_content"] = parsed.reasoning
    if calls:
        assistant["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments or {}}} for c in calls
        ]
    stop_reason = "max_tokens" if finish == "length" else "tool_use" if calls else "end_turn"
    events.append({"messageStop": {"stopReason": stop_reason}})
    return Reply(text, parsed, finish, output_signature(content), assistant), events


def usage_event(response: Any, prompt_tokens: int) -> StreamEvent:
    """Strands' metadata event: token usage (cached prompt tokens too) and latency."""
    usage: dict[str, Any] = {
        "inputTokens": prompt_tokens,
        "outputTokens": response.completion_tokens,
        "totalTokens": prompt_tokens + response.completion_tokens,
    }
    if response.cached_tokens:
        usage["cacheReadInputTokens"] = response.cached_tokens
    latency = int((response.e2e_latency or 0.0) * 1000)
    return {"metadata": {"usage": usage, "metrics": {"latencyMs": latency}}}  # type: ignore[typeddict-item]


def _block(delta: dict[str, Any]) -> list[StreamEvent]:
    return [
        {"contentBlockStart": {"start": {}}},
        {"contentBlockDelta": {"delta": delta}},
        {"contentBlockStop": {}},
    ]  # type: ignore[list-item]


async def reply_to(
    model: Any, response: Any, prompt: tuple[Any, ...], record: tuple[int, Any] | None
) -> list[StreamEvent]:
    """``model``'s reply as Strands stream events. ``prompt`` = (tool specs, prompt text, the cut call
    the reply goes on from, the constraint's reasoning mode). ``record`` = (the output's position in the
    history, the turn's chat-template messages) for an episode turn: its output and tool calls are
    recorded before any event is handed out; None for a side call (nothing is recorded)."""
    tool_specs, prompt_text, cut, constraint = prompt
    templater, lane = model.templater, model.lane
    output_ids = cut[1].tolist() + response.output_ids if cut is not None else response.output_ids
    body = output_ids[:-1] if output_ids and output_ids[-1] in templater.stop_token_ids else output_ids
    text = await templater.decode_async(body)
    finish = response.finish_reason.type if response.finish_reason else "stop"
    opened = templater.prompt_opens_reasoning(prompt_text)
    book = model.calls if record is not None else None
    result, events = reply(text, finish, model.tool_parser, tool_specs, opened, book, lane.stats)
    result.constraint = constraint
    model.last_reply = result
    prompt_tokens = response.prompt_tokens
    if record is not None:
        model.last_output_text = text
        lane.stats.finish_reasons.append(finish)
        model.history.outputs.append(OutputRecord(record[0], result.signature, record[1], result.assistant))
        if prompt_tokens is None:
            prompt_tokens = len(lane.trajectory) - len(output_ids)
    events.append(usage_event(response, prompt_tokens or 0))
    return events


def structured_value(output_model: Any, last: Reply | None) -> Any:
    """The ``output_model`` instance a constrained reply holds (after its reasoning, when the grammar
    let the reply open with it: no ``</`` can stand inside it)."""
    text = last.text if last is not None else ""
    if last is not None and last.constraint == "open":
        text = text.partition(THINK_CLOSE)[2]
    try:
        return output_model.model_validate_json(text.strip())
    except ValueError as exc:
        raise StructuredOutputException(
            f"the constrained reply does not validate as {output_model.__name__}: {exc}"
        ) from exc
