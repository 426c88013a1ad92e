"""Loop limiter hook: caps tool iterations, tool calls and model calls per episode.

The limit triggers when the assistant message that asks for one tool round too many is added, before
any of those tools run, so the trajectory ends on the model's own output and needs no truncation.
The model has seen the results of every round it was allowed.
"""

from __future__ import annotations

from typing import Any

from strands.hooks import (
    BeforeInvocationEvent,
    BeforeModelCallEvent,
    HookProvider,
    HookRegistry,
    MessageAddedEvent,
)

from strands_slime.errors import ModelCallLimitReached, ToolLimitReached

DEFAULT_MAX_MODEL_CALLS = 64
"""The one default cap on model calls per episode (the limiter's and the rollout config's).

Strands' nested async generators overflow the stack at a few hundred cycles, so the cap stops well
before; 64 is still ten times what the default 5 tool rounds need (one call per round plus the answer)."""
MAX_MODEL_CALLS_LIMIT = 256
"""The highest ``max_model_calls`` the rollout config accepts (below Strands' recursion failure)."""


_COUNTERS = ("tool_iter_count", "tool_call_count", "model_call_count")


class ToolLimiter(HookProvider):
    """Stop the episode when the model asks for more than ``max_tool_iters`` tool rounds (parallel
    calls in one message are one round) or more than ``max_tool_calls`` calls in all."""

    def __init__(
        self,
        max_tool_iters: int | None = None,
        max_tool_calls: int | None = None,
        *,
        max_model_calls: int | None = DEFAULT_MAX_MODEL_CALLS,
        reset_on_invocation: bool = False,
    ) -> None:
        for name, value in (
            ("max_tool_iters", max_tool_iters),
            ("max_tool_calls", max_tool_calls),
            ("max_model_calls", max_model_calls),
        ):
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value}")
        self.max_tool_iters = max_tool_iters
        self.max_tool_calls = max_tool_calls
        self.max_model_calls = max_model_calls
        self.reset_on_invocation = reset_on_invocation
        self.reset()

    def reset(self) -> None:
        """Zero the counters and forget which limit was hit."""
        self.tool_iter_count = 0
        self.tool_call_count = 0
        self.model_call_count = 0
        self.limit_hit: str | None = None

    def counters(self) -> dict[str, int]:
        """The counts so far (plain JSON), to carry an aborted episode over to its resumed attempt."""
        return {name: getattr(self, name) for name in _COUNTERS}

    def restore_counters(self, counters: dict[str, int]) -> None:
        """Continue from :meth:`counters` of an earlier attempt of the same episode.

        Raises:
            ValueError: a count is missing or negative."""
        values = {name: int(counters[name]) for name in _COUNTERS}
        if min(values.values()) < 0:
            raise ValueError(f"negative limiter counters: {values}")
        for name, value in values.items():
            setattr(self, name, value)

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Count model calls before each one and tool rounds/calls when an assistant message is added."""
        registry.add_callback(MessageAddedEvent, self._on_message_added)
        registry.add_callback(BeforeModelCallEvent, self._on_before_model_call)
        if self.reset_on_invocation:
            registry.add_callback(BeforeInvocationEvent, lambda _event: self.reset())

    def _on_before_model_call(self, event: BeforeModelCallEvent) -> None:
        if self.max_model_calls is not None and self.model_call_count >= self.max_model_calls:
            self.limit_hit = "model_calls"
            raise ModelCallLimitReached(f"model call limit reached ({self.max_model_calls} calls)")
        self.model_call_count += 1

    def _on_message_added(self, event: MessageAddedEvent) -> None:
        message = event.message
        if message.get("role") != "assistant":
            return
        calls = sum(1 for block in message.get("content") or [] if "toolUse" in block)
        if not calls:
            return
        iterations = self.tool_iter_count + 1
        total = self.tool_call_count + calls
        if self.max_tool_iters is not None and iterations > self.max_tool_iters:
            self.limit_hit = "tool_iterations"
            raise ToolLimitReached(
                f"tool iteration limit reached ({self.max_tool_iters} rounds)",
                tool_iterations=self.tool_iter_count,
                tool_calls=self.tool_call_count,
            )
        if self.max_tool_calls is not None and total > self.max_tool_calls:
            self.limit_hit = "tool_calls"
            raise ToolLimitReached(
                f"tool call limit reached ({self.max_tool_calls} calls; {calls} more requested)",
                tool_iterations=self.tool_iter_count,
                tool_calls=self.tool_call_count,
            )
        self.tool_iter_count = iterations
        self.tool_call_count = total


class ToolIterationLimiter(ToolLimiter):
    """Seed API (strands-sglang 0.1.x): ``ToolIterationLimiter(max_iterations)``."""

    def __init__(self, max_iterations: int | None = None, **kwargs: Any) -> None:
        super().__init__(max_tool_iters=max_iterations, **kwargs)

    @property
    def max_iterations(self) -> int | None:
        """Seed name for ``max_tool_iters``."""
        return self.max_tool_iters

    @property
    def iteration_count(self) -> int:
        """Seed name for ``tool_iter_count``."""
        return self.tool_iter_count
