"""Typed reasons an agent episode ends early.

Strands wraps exceptions raised in later event-loop cycles in ``EventLoopException``; the rollout uses
:func:`find_episode_end` to recognise ours through any wrapping and map them to a slime status.
"""

from __future__ import annotations

from typing import Any

from strands.types.exceptions import ContextWindowOverflowException


class EpisodeEnded(Exception):
    """Base class: the episode stopped on a clean message boundary for a known reason."""

    reason: str = "ended"


class ResponseBudgetExhausted(EpisodeEnded):
    """The episode's response-token budget (slime's ``rollout_max_response_len``) is used up."""

    reason = "response_budget"

    def __init__(self, used: int, budget: int, pending: int = 0) -> None:
        self.used = used
        self.budget = budget
        self.pending = pending
        extra = f" (+{pending} pending prompt tokens)" if pending else ""
        super().__init__(f"response budget exhausted: {used}{extra} of {budget} tokens used")


class ContextLimitExceeded(EpisodeEnded, ContextWindowOverflowException):
    """The next request would not fit in the context window. Also a Strands
    ``ContextWindowOverflowException`` so conversation managers see the usual type."""

    reason = "context_length"

    def __init__(self, message: str, *, prompt_tokens: int | None = None, limit: int | None = None) -> None:
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        super().__init__(message)


class GenerationAborted(EpisodeEnded):
    """The server aborted the generation (slime's abort, a weight update, ...).

    ``trajectory`` is a snapshot of the token trajectory including the partial output, if any."""

    reason = "aborted"

    def __init__(self, message: str, *, trajectory: Any = None, queued: bool = False) -> None:
        self.trajectory = trajectory
        self.queued = queued
        super().__init__(message)


class ToolLimitReached(EpisodeEnded):
    """The model asked for more tool iterations or tool calls than allowed."""

    reason = "tool_limit"

    def __init__(self, message: str, *, tool_iterations: int, tool_calls: int) -> None:
        self.tool_iterations = tool_iterations
        self.tool_calls = tool_calls
        super().__init__(message)


class ModelCallLimitReached(EpisodeEnded):
    """Hard cap on model calls per episode (Strands' nested generators overflow the stack at a few
    hundred cycles)."""

    reason = "model_call_limit"


class TrajectoryDesyncError(Exception):
    """The agent's message history no longer continues the token trajectory (a conversation manager
    compacted it, or code edited, cleared or replaced ``agent.messages``), so the new messages cannot
    be appended to what the model read; the message names the cause and the fix."""


class TokenStateUnavailable(TrajectoryDesyncError):
    """A restored agent's history holds outputs an ``SGLangModel`` sampled, but their token state cannot
    be resumed exactly (not saved, another tokenizer, damaged); the message says what to do."""


class ModelInUseError(RuntimeError):
    """An ``SGLangModel`` holds one agent's episode; another agent called it (one model per agent, or
    ``model.reset()`` before handing it on)."""


def find_episode_end(exc: BaseException | None) -> EpisodeEnded | None:
    """Return the :class:`EpisodeEnded` inside ``exc`` (Strands' ``EventLoopException``, ``__cause__``
    and ``__context__`` chains, exception groups), or None."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc] if isinstance(exc, BaseException) else []
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, EpisodeEnded):
            return current
        original = getattr(current, "original_exception", None)
        if isinstance(original, BaseException):
            stack.append(original)
        members = getattr(current, "exceptions", None)  # ExceptionGroup (3.11+) without naming it
        if isinstance(members, (list, tuple)):
            stack.extend(m for m in members if isinstance(m, BaseException))
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                stack.append(linked)
    return None
