"""Where the model's outputs sit in the agent's history, and whether a model call continues it.

The token trajectory holds what the model read and sampled, one turn per call. A call continues the
episode when the history it gets is the history the trajectory was built from, extended by new
messages, or cut back to right where one of the episode's calls ended (Strands runs that call again:
a retry, a throttled call, context-overflow recovery), or ending in another message where the model's
last output was (``agent.cancel()`` replaces an output the agent discarded). Anything else means the
history changed under the trajectory: a conversation manager compacted it, or code edited, cleared or
replaced ``agent.messages``. :class:`EpisodeHistory` tells these apart cheaply:

* each recorded output has its position in the history and a signature of what we emitted;
* each message the model has read has a digest (a stable hash of its role and content, as Strands
  hands them to a model). A call's messages are digested only where they are new to the model (with
  the plugin that is the last output and what follows it), so checking a call costs O(new messages);
  :meth:`EpisodeHistory.verify` checks a whole history (the plugin runs it once per invocation).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

BLANK_TEXT = "[blank text]"
"""What Strands writes into an assistant message whose content is empty, before a model reads it."""


@dataclass(slots=True)
class OutputRecord:
    """What we emitted for one turn, to find it again in the agent's message history, plus the
    chat-template view of the turn (the messages before it and the parsed output) for audits."""

    position: int
    signature: tuple[Any, ...]
    prompt_messages: list[dict[str, Any]]
    assistant: dict[str, Any]


def output_signature(content: Sequence[Mapping[str, Any]]) -> tuple[Any, ...]:
    """The tool-call ids, visible text and reasoning of an assistant message: equal for what we
    emitted and for the message Strands stored from it (blank and placeholder text aside)."""
    ids = tuple(b["toolUse"].get("toolUseId") for b in content if "toolUse" in b)
    texts = [str(b["text"]).strip() for b in content if "text" in b]
    text = "\n".join(t for t in texts if t and t != BLANK_TEXT)
    reasoning = "".join(
        b["reasoningContent"].get("reasoningText", {}).get("text", "")
        for b in content
        if "reasoningContent" in b
    )
    return ids, text, reasoning.strip()


def _opaque(value: Any) -> str:
    """JSON stand-in for what ``json`` cannot write (image bytes, ...): a digest of its repr."""
    raw = bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else repr(value).encode()
    return "<" + hashlib.blake2b(raw, digest_size=8).hexdigest() + ">"


def _assistant_block(block: Mapping[str, Any]) -> Any:
    """An assistant block as compared: Strands renames an invalid tool name before a model reads it,
    so the name is left out (the call id identifies the call)."""
    if "toolUse" in block:
        return {"toolUse": {k: v for k, v in block["toolUse"].items() if k != "name"}}
    return block


def _blank_text(block: Mapping[str, Any]) -> bool:
    return "text" in block and len(block) == 1 and str(block["text"]).strip() in ("", BLANK_TEXT)


def message_digest(message: Mapping[str, Any]) -> str:
    """A stable digest (the same in every process) of a message's role and content, equal for a
    message in ``agent.messages`` and for the copy Strands hands a model (which fills empty assistant
    text with a placeholder, drops blank text and renames invalid tool names)."""
    role = message.get("role")
    blocks: Sequence[Any] = message.get("content") or []
    if role == "assistant":
        blocks = [_assistant_block(b) for b in blocks if not _blank_text(b)]
    payload = json.dumps([role, blocks], sort_keys=True, ensure_ascii=False, default=_opaque)
    return hashlib.blake2b(payload.encode(), digest_size=8).hexdigest()


@dataclass(slots=True)
class Verdict:
    """How a call relates to the episode. ``keep`` outputs stay (the trajectory is rolled back to
    that many turns); the call's new messages start at ``start`` in its message list; ``digests`` are
    those of the call's messages the model has not read yet, from history position ``digest_from``.
    ``changed`` says why the history does not continue the episode (then nothing else applies)."""

    keep: int = 0
    start: int = 0
    digests: list[str] = field(default_factory=list)
    digest_from: int = 0
    changed: str | None = None

    @property
    def initial(self) -> bool:
        """Whether the call starts the episode (no output kept: the whole prompt is rendered)."""
        return self.changed is None and self.keep == 0


@dataclass
class EpisodeHistory:
    """The episode's outputs and the digests of the messages the model read, by history position."""

    outputs: list[OutputRecord] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    changed: str | None = None
    """Why the history no longer continues the episode, as :meth:`verify` found (None: it does)."""

    def judge(self, messages: Sequence[Mapping[str, Any]], offset: int) -> Verdict:
        """Whether ``messages`` (the history from position ``offset`` on) continue the episode."""
        outputs = self.outputs
        if not outputs:  # nothing sampled yet: any history starts the episode (a first call re-run
            self.digests, self.changed = [], None  # after a context overflow, say)
            return self._verdict(messages, offset, keep=0)
        if self.changed is not None:
            return Verdict(changed=self.changed)
        end = offset + len(messages)
        known = len(self.digests)
        for position in range(offset, min(known, end)):
            if message_digest(messages[position - offset]) != self.digests[position]:
                return Verdict(changed=_edited(position))
        last = outputs[-1]
        if end > last.position:
            index = last.position - offset
            if index < 0:
                return Verdict(
                    changed=f"the call's messages start after the model's last output ({last.position})"
                )
            message = messages[index]
            if message["role"] == "assistant" and output_signature(message["content"]) == last.signature:
                return self._verdict(messages, offset, keep=len(outputs))
            # Another message where the last output was: the agent discarded it (agent.cancel()) or
            # code replaced it. That turn leaves the trajectory; what replaced it is a new message.
            return self._verdict(messages, offset, keep=len(outputs) - 1)
        for keep in range(len(outputs) - 1, -1, -1):  # a call Strands runs again ends where it ended
            if outputs[keep].position == end:
                return self._verdict(messages, offset, keep=keep)
            if outputs[keep].position < end:
                break
        return Verdict(
            changed=f"the history ends at message {end}, where none of the episode's model calls ended "
            f"(the model's last output is message {last.position})"
        )

    def _verdict(self, messages: Sequence[Mapping[str, Any]], offset: int, keep: int) -> Verdict:
        """The verdict for keeping ``keep`` outputs, once the kept ones are checked to be in place."""
        start = 0
        if keep:
            kept = self.outputs[keep - 1]
            index = kept.position - offset
            if index < 0 or index >= len(messages):
                return Verdict(
                    changed=f"the call does not hold the model's output at message {kept.position}"
                )
            message = messages[index]
            if message["role"] != "assistant" or output_signature(message["content"]) != kept.signature:
                return Verdict(changed=_edited(kept.position))
            start = index + 1
        elif offset:
            return Verdict(changed="the call's messages do not start at the beginning of the history")
        end = offset + len(messages)
        known = min(len(self.digests), end)
        digest_from = max(known, offset)
        digests = [message_digest(m) for m in messages[digest_from - offset :]]
        return Verdict(keep=keep, start=start, digests=digests, digest_from=digest_from)

    def accept(self, verdict: Verdict) -> None:
        """Record a call the episode goes on with: roll back to ``verdict.keep`` outputs and note the
        digests of the messages the model reads now."""
        del self.outputs[verdict.keep :]
        del self.digests[verdict.digest_from :]
        self.digests.extend(verdict.digests)

    def verify(self, messages: Sequence[Mapping[str, Any]]) -> str | None:
        """Check a whole history (``agent.messages``) against what the model read; remember and return
        why it does not continue the episode (None: it does). O(history): once per invocation."""
        if self.changed is None:
            known = len(self.digests)
            for position in range(min(len(messages), known)):
                if message_digest(messages[position]) != self.digests[position]:
                    self.changed = _edited(position)
                    break
            else:
                if len(messages) < known and all(o.position != len(messages) for o in self.outputs):
                    self.changed = (
                        f"agent.messages holds {len(messages)} messages, fewer than the {known} the model "
                        "already read (cleared or cut?)"
                    )
        return self.changed

    def start_over(self) -> None:
        """Forget the outputs and digests (a new context segment, or a new episode)."""
        self.outputs = []
        self.digests = []
        self.changed = None


def _edited(position: int) -> str:
    return f"agent.messages[{position}] is not the message the model read there (edited or replaced?)"
