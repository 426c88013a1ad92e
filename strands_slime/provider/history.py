"""Where the model's outputs sit in the agent's history, and whether a model call continues it.

A call continues the episode when its history is the trajectory's, extended by new messages, cut back
to where one of the episode's calls ended (Strands runs that call again: a retry, context-overflow
recovery), or ending in another message where the model's last output was (``agent.cancel()``).
Anything else means the history changed under the trajectory (a conversation manager, or code that
edited ``agent.messages``). :class:`EpisodeHistory` tells these apart cheaply: outputs keep their
position and a signature, read messages a digest, and a call digests only the messages new to the
model, so checking costs O(new messages). See docs/provider.md, "Edits to the history".
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strands_slime.errors import ModelInUseError

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


@dataclass(slots=True)
class EpisodeHistory:
    """The episode's outputs and the digests of the messages the model read, by history position; which
    agent's history it is, and where the plugin cut the current call's messages."""

    outputs: list[OutputRecord] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    changed: str | None = None
    """Why the history no longer continues the episode, as :meth:`verify` found (None: it does)."""
    agent: weakref.ref[Any] | None = None
    """The agent whose episode this is (set by its first call; cleared with the episode)."""
    attached: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
    """Agents the model's plugin is on: a call from no agent loop is then a side call."""
    cut: tuple[int, int] | None = None
    """``(position, id(agent))`` where the plugin cut the current call's messages."""
    removed_count: int | None = None
    """The agent's conversation manager's ``removed_message_count`` at the latest call."""
    initial_position: int = 0
    tools_fingerprint: tuple[Any, ...] | None = None

    # ------------------------------------------------------------------ whose call is it

    def serves(self, agent: Any) -> bool:
        """Whether calls from ``agent``'s loop are this episode's (it is free, or ``agent``'s)."""
        return self.agent is None or self.agent() is agent

    def is_side_call(self, agent: Any, fingerprint: Callable[[], tuple[Any, ...]]) -> bool:
        """Whether a call is served outside the episode. An agent loop's call is the episode's (the first
        binds the episode to its agent; another agent's is refused). A call from no agent loop (Strands'
        summarizer calls ``model.stream`` directly) is a side call once an agent holds the episode or has
        the model's plugin (a summary before the agent's first call, too); a model driven by hand treats
        a call with other tools or system prompt as one."""
        if agent is not None:
            if self.agent is None:
                self.agent = weakref.ref(agent)
                return False
            if self.agent() is agent:
                return False
            raise ModelInUseError(
                "this SGLangModel holds the episode of another agent"
                + (" (no longer alive)" if self.agent() is None else "")
                + ": one model serves one agent's episode, or two agents' trajectories would mix. Build one "
                "SGLangModel per agent (they may share client= and the tokenizer), or call model.reset() to "
                "start a new episode with this agent (read model.trajectory first). Strands features that "
                "run an agent of their own (a summarization agent, steering, a goal judge) need their own "
                "model too, e.g. Agent(aux_model=...)"
            )
        if self.agent is not None or len(self.attached):
            return True
        return bool(self.outputs) and fingerprint() != self.tools_fingerprint

    # ------------------------------------------------------------------ where the plugin cuts a call

    def matching_output(self, messages: Sequence[Mapping[str, Any]], offset: int) -> int:
        """How many recorded outputs to keep: up to the latest one found in ``messages`` (which start at
        history position ``offset``), 0 when none is."""
        outputs = self.outputs
        for keep in range(len(outputs), 0, -1):
            index = outputs[keep - 1].position - offset
            if 0 <= index < len(messages):
                message = messages[index]
                if (
                    message["role"] == "assistant"
                    and output_signature(message["content"]) == outputs[keep - 1].signature
                ):
                    return keep
        return 0

    def trim_point(
        self, agent: Any, messages: Sequence[Mapping[str, Any]], whole: bool = False
    ) -> int | None:
        """Where the plugin may cut ``agent``'s call (a whole history): at the latest output found in
        place, which the call then starts with. None: hand the whole history (``whole``, another agent's
        call, the history changed, or no output of the episode is in it)."""
        if self.cut is not None and self.cut[1] == id(agent):
            self.cut = None
        if whole or not self.serves(agent) or self.changed is not None:
            return None
        keep = self.matching_output(messages, 0)
        if not keep:
            return None
        position = self.outputs[keep - 1].position
        self.cut = (position, id(agent))
        return position

    def take_cut(self, agent: Any, messages: Sequence[Mapping[str, Any]]) -> int:
        """The position the plugin cut this call's messages at (0: they are a whole history)."""
        cut, self.cut = self.cut, None
        if cut is None or cut[1] != id(agent):
            return 0
        offset = cut[0]
        for record in reversed(self.outputs):  # the cut is at the latest output in place: one or two checks
            if record.position == offset:
                first = messages[0] if messages else None
                if first is not None and first["role"] == "assistant":
                    if output_signature(first["content"]) == record.signature:
                        return offset
                break
            if record.position < offset:
                break
        return 0  # not the list our middleware cut (another one replaced it): a whole history

    def check(self, agent: Any) -> str | None:
        """Check ``agent.messages`` against what the model read (the plugin does at every invocation's
        start; O(history)): why it no longer continues the episode, or None."""
        if not self.outputs or self.agent is None or self.agent() is not agent:
            return None
        return self.verify(agent.messages)

    def change_cause(self, reason: str, agent: Any) -> str:
        """Why the history changed, in words, and what to do about it. A conversation manager that
        removed or summarized messages since the model's previous call is named, with the fix."""
        manager = getattr(agent, "conversation_manager", None)
        removed = getattr(manager, "removed_message_count", None)
        if isinstance(removed, int) and self.removed_count is not None and removed != self.removed_count:
            return (
                f"the agent's conversation manager ({type(manager).__name__}) compacted the history the "
                f"trajectory holds ({removed - self.removed_count} message(s) removed or summarized since "
                "the model's previous call). One trajectory cannot hold a compacted history: pass "
                "new_segment_on_context_change=True to close it and train each context segment as its own "
                "sample (the rollout's fanout), or use NullConversationManager"
            )
        return (
            f"the agent's history no longer continues the trajectory: {reason}. The trajectory holds what "
            "the model read, and text it read cannot change: add the change as a new message instead, or "
            "call model.reset() to start a new episode from the changed history (read model.trajectory "
            "first); with new_segment_on_context_change=True such a change starts a new context segment"
        )

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
        """Forget the outputs and digests (a new context segment)."""
        self.outputs = []
        self.digests = []
        self.changed = None

    def transcript(self) -> list[dict[str, Any]]:
        """The episode as chat-template messages: each output's prompt messages, then the output."""
        messages: list[dict[str, Any]] = []
        for record in self.outputs:
            messages.extend(record.prompt_messages)
            messages.append(record.assistant)
        return messages

    def state(self, with_transcript: bool) -> dict[str, Any]:
        """Where the outputs sit and what the model read, as plain JSON (:meth:`restore` reads it)."""
        fingerprint = self.tools_fingerprint
        return {
            "outputs": [
                [
                    r.position,
                    [list(r.signature[0]), *r.signature[1:]],
                    r.prompt_messages if with_transcript else [],
                    r.assistant if with_transcript else {},
                ]
                for r in self.outputs
            ],
            "digests": list(self.digests),
            "initial_position": self.initial_position,
            "tools_fingerprint": [list(fingerprint[0]), fingerprint[1]] if fingerprint is not None else None,
            "removed_count": self.removed_count,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Go on from :meth:`state` (the agent binds again at its next call).

        Raises:
            KeyError, TypeError, ValueError: ``state`` is malformed."""
        self.outputs = [
            OutputRecord(int(position), (tuple(ids), text, reasoning), list(prompt), dict(assistant))
            for position, (ids, text, reasoning), prompt, assistant in state["outputs"]
        ]
        self.digests = [str(d) for d in state.get("digests", ())]
        self.changed = None
        self.initial_position = int(state["initial_position"])
        fingerprint = state["tools_fingerprint"]
        self.tools_fingerprint = (tuple(fingerprint[0]), fingerprint[1]) if fingerprint else None
        removed = state.get("removed_count")
        self.removed_count = int(removed) if removed is not None else None


def _edited(position: int) -> str:
    return f"agent.messages[{position}] is not the message the model read there (edited or replaced?)"
