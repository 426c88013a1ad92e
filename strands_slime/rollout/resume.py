"""Partial-rollout resume: an aborted agent episode goes on where it stopped.

An aborted episode keeps what it produced in the sample itself, as slime's own ``generate`` does;
``sample.metadata[STATE_KEY]`` holds the small, plain-JSON rest (:func:`snapshot`). No tokenizer,
client or tensor goes in there, so the sample stays picklable and ``Sample.to_dict``-able in slime's
buffer. This module is the format and its checks; the episode
(:class:`strands_slime.rollout.episode.Episode`) saves and restores itself with it. What a resumed
attempt sends and runs again: docs/rollout.md, "--partial-rollout".
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from strands.hooks import AfterToolCallEvent, BeforeToolCallEvent, HookProvider, HookRegistry
from strands.tools.tools import PythonAgentTool
from strands.types.tools import ToolResult, ToolUse

from strands_slime.rollout import slime_compat

logger = logging.getLogger(__name__)

STATE_KEY = "strands_resume"
"""``sample.metadata`` key of the saved episode state (only on ABORTED samples under ``--partial-rollout``)."""

STATE_VERSION = 1
FINISHED_STATUSES = ("COMPLETED", "TRUNCATED")
TOOL_STAT_NAMES = ("calls", "errors", "timeouts", "infra_failures", "seconds")
"""An episode that ended like this before slime's abort flag was seen is not run again on resume."""


def enabled(args: Any, evaluation: bool) -> bool:
    """Whether aborted episodes are saved for resumption: training rollouts under ``--partial-rollout``."""
    return bool(getattr(args, "partial_rollout", False)) and not evaluation


def prompt_key(prompt: Any) -> str:
    """A digest of ``sample.prompt``: a saved state only resumes the prompt it was made for."""
    text = json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def saved_state(args: Any, sample: Any, evaluation: bool) -> dict[str, Any] | None:
    """The episode state to resume ``sample`` from, or None to start from scratch.

    None when resumption is off, the sample is not ABORTED, carries no state, or its state does not
    match it (another prompt, tokens changed since): such a sample starts over as before."""
    metadata = getattr(sample, "metadata", None)
    state = metadata.get(STATE_KEY) if isinstance(metadata, Mapping) else None
    if state is None or not enabled(args, evaluation):
        return None
    if slime_compat.status_name(sample) != "aborted":
        return None
    problem = _mismatch(sample, state)
    if problem is not None:
        logger.warning("partial rollout: starting the episode over: %s", problem)
        return None
    return state


def _mismatch(sample: Any, state: Any) -> str | None:
    """Why ``state`` cannot resume ``sample`` (None when it can)."""
    if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
        return f"the saved state is not a version-{STATE_VERSION} strands_slime state"
    try:
        if state["prompt_key"] != prompt_key(sample.prompt):
            return "the sample's prompt is not the one the state was saved for"
        tokens = list(getattr(sample, "tokens", None) or [])
        response_length = int(getattr(sample, "response_length", 0) or 0)
        if len(tokens) != int(state["token_count"]) or response_length != int(state["response_length"]):
            return (
                f"the sample has {len(tokens)} tokens ({response_length} response), the state was saved "
                f"at {state['token_count']} ({state['response_length']} response)"
            )
        for name in ("loss_mask", "rollout_log_probs"):
            values = getattr(sample, name, None)
            if values is None or len(values) != response_length:
                return f"sample.{name} does not cover the response"
    except (KeyError, TypeError, ValueError) as exc:
        return f"the saved state is malformed ({type(exc).__name__}: {exc})"
    return None


class ToolResultRecorder(HookProvider):
    """Records the result of every tool call that finished, and answers a call that already finished
    in an earlier attempt from its saved result instead of running the tool again.

    Tools get :meth:`tool_abort_check` as their abort check: once a tool has seen slime's abort, results
    that arrive after it are treated as cut short (the sandbox answers an aborted call with an error
    result) and are not kept, so that call runs again on resume."""

    def __init__(self, abort_check: Callable[[], bool], saved: Mapping[str, Any] | None = None) -> None:
        self.abort_check = abort_check
        self.finished: dict[str, dict[str, Any]] = {str(k): dict(v) for k, v in (saved or {}).items()}
        self.replayed = 0
        """Calls answered from saved results in this attempt."""
        self._abort_seen = False

    def tool_abort_check(self) -> bool:
        """slime's abort flag, as tools see it; remembers that a tool saw it."""
        aborted = self.abort_check()
        if aborted:
            self._abort_seen = True
        return aborted

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Replay before a call, record after it."""
        registry.add_callback(BeforeToolCallEvent, self._replay)
        registry.add_callback(AfterToolCallEvent, self._record)

    def _replay(self, event: BeforeToolCallEvent) -> None:
        saved = self.finished.get(str(event.tool_use.get("toolUseId")))
        if saved is None or event.selected_tool is None:
            return
        self.replayed += 1
        event.selected_tool = _saved_result_tool(
            event.selected_tool.tool_name, event.selected_tool.tool_spec, saved
        )

    def _record(self, event: AfterToolCallEvent) -> None:
        """Keep a finished call's result. A call a hook cancelled (the plugin's answer to a malformed
        call) finished too: the model reads its result like any other, so it is kept and replayed."""
        if self._abort_seen or event.exception is not None:
            return
        result = event.result
        if isinstance(result, Mapping) and result.get("toolUseId"):
            self.finished[str(result["toolUseId"])] = copy.deepcopy(dict(result))


def _saved_result_tool(name: str, spec: Any, saved: Mapping[str, Any]) -> PythonAgentTool:
    """A stand-in for a tool whose call finished in an earlier attempt: it returns that result."""

    async def saved_result(tool_use: ToolUse, **_: Any) -> ToolResult:
        return {**copy.deepcopy(dict(saved)), "toolUseId": tool_use["toolUseId"]}  # type: ignore[typeddict-item]

    return PythonAgentTool(name, spec, saved_result)


def resumable_messages(messages: list[Any], recorder: ToolResultRecorder, read: int = 0) -> list[Any]:
    """The agent's history without a tool-result message holding a result the abort cut short: Strands
    then runs that round again (finished calls answered from the recorder). The first ``read``
    messages, those the model already read, are never dropped: its trajectory holds them."""
    kept = list(messages)
    if len(kept) > read and kept[-1].get("role") == "user":
        ids = [
            str(block["toolResult"].get("toolUseId"))
            for block in kept[-1].get("content") or []
            if "toolResult" in block
        ]
        if ids and any(tool_id not in recorder.finished for tool_id in ids):
            kept.pop()
    return kept


def pending_round_results(messages: list[Any], recorder: ToolResultRecorder) -> dict[str, Any]:
    """The finished results of the tool round the history ends with (the one that runs again on
    resume); earlier rounds' results are in the messages already."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant":
        return {}
    ids = {str(b["toolUse"].get("toolUseId")) for b in last.get("content") or [] if "toolUse" in b}
    return {tool_id: result for tool_id, result in recorder.finished.items() if tool_id in ids}


def has_next_step(messages: list[Any]) -> bool:
    """Whether the history ends where the agent goes on by itself: a user message (the model is
    next) or an assistant message asking for tools (a tool round is next)."""
    if not messages:
        return False
    last = messages[-1]
    if last.get("role") == "user":
        return True
    return any("toolUse" in block for block in last.get("content") or [])


def tool_stats_dict(tool_stats: Any) -> dict[str, Any]:
    """The sandbox statistics (plain JSON) an aborted episode carries over."""
    if tool_stats is None:
        return {}
    return {name: getattr(tool_stats, name) for name in TOOL_STAT_NAMES if hasattr(tool_stats, name)}


def restore_tool_stats(tool_stats: Any, saved: Mapping[str, Any] | None) -> None:
    """Continue the sandbox statistics of an earlier attempt (:func:`tool_stats_dict`)."""
    if tool_stats is not None:
        for name, value in (saved or {}).items():
            setattr(tool_stats, name, value)


def reset_tool_stats(tool_stats: Any) -> None:
    """Zero the sandbox statistics (an attempt that starts over)."""
    for name in TOOL_STAT_NAMES:
        if tool_stats is not None and hasattr(tool_stats, name):
            setattr(tool_stats, name, type(getattr(tool_stats, name))())


def detached(state: dict[str, Any]) -> dict[str, Any] | None:
    """A plain-JSON copy of ``state`` (nothing the buffer holds aliases the live episode), or None when
    it is not JSON (logged)."""
    try:
        return json.loads(json.dumps(state, ensure_ascii=False))
    except (TypeError, ValueError) as exc:
        logger.warning("partial rollout: the episode state is not JSON (%s); not saved", exc)
        return None


def saved_messages(state: Mapping[str, Any]) -> list[Any]:
    """A copy of the saved Strands messages to start the resumed agent with.

    Raises:
        ValueError: they are not Strands messages."""
    messages = copy.deepcopy(list(state["messages"]))
    if not all(isinstance(m, Mapping) and m.get("role") in ("user", "assistant") for m in messages):
        raise ValueError("the saved messages are not Strands messages")
    return messages
