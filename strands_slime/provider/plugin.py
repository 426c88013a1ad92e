"""The Strands plugin an agent needs to drive an :class:`~strands_slime.provider.model.SGLangModel`.

``Agent(model=model, plugins=[model.plugin()], ...)``. A model provider cannot reach the agent's hooks
or middleware through Strands' model API, so what token-in/token-out needs of the agent loop is one
explicit plugin instead of something the model installs behind the caller's back:

* **Malformed tool calls** (bad JSON, an unknown parameter, a call cut off mid-way) are answered with
  the parser's explanation as an error tool result (``BeforeToolCallEvent.cancel_tool``). Without the
  plugin Strands runs the tool with ``{}`` and the model reads Strands' validation error instead.
* **Only new messages reach the model.** Strands deep-copies, normalizes and (for its tracer)
  serializes the messages it hands a model on every call: O(history) per turn. The model reads
  nothing before its own last output (it keeps the tokens), so an ``InvokeModelStage.Input``
  middleware hands it only the messages from there on; ``agent.messages`` keeps the whole history, and
  when an OpenTelemetry span records, the call is left whole so traces show every message.
* **Edits to the history are found.** When each invocation starts, ``agent.messages`` is checked
  against the messages the model read (one pass over the history per invocation, none per turn): an
  edit, a cleared or cut history is then not silently ignored (the model's next call starts a new
  context segment or raises ``TrajectoryDesyncError``, naming the cause).

A model used without its plugin stays exact (same ids, mask and logprobs) and says once per process
what it misses (a WARNING naming ``plugins=[model.plugin()]``).
"""

from __future__ import annotations

from typing import Any

from strands.hooks import BeforeInvocationEvent, BeforeToolCallEvent
from strands.plugins import Plugin, hook

try:  # Strands >= 1.62: middleware around each model call
    from strands.middleware import InvokeModelContext, InvokeModelStage
except ImportError:  # pragma: no cover - depends on the installed Strands
    InvokeModelContext = InvokeModelStage = None  # type: ignore[assignment,misc]

try:  # a dependency of Strands
    from opentelemetry import trace as otel_trace
except ImportError:  # pragma: no cover - depends on the environment
    otel_trace = None  # type: ignore[assignment]

__all__ = ["TITOPlugin"]


class TITOPlugin(Plugin):
    """What one :class:`~strands_slime.provider.model.SGLangModel` needs of the agent that drives it
    (see the module docstring). The model module imports this one, so the model is not typed here."""

    name = "strands-slime-tito"

    def __init__(self, model: Any) -> None:
        self.model = model
        # Plugin.__init__ would walk every attribute of the class hierarchy (64 us, once per episode) and
        # keep the bound hooks it finds on the plugin; set here, its own guard skips the walk, and the
        # hooks are bound when asked (``hooks``) instead of kept.
        self._hooks = []
        self._tools = []
        super().__init__()

    @property
    def hooks(self) -> list[Any]:
        """The ``@hook`` methods, bound anew on each read (Strands reads them once, to register them).
        A plugin that kept its own bound methods would be a reference cycle holding the model, its
        trajectory and history: garbage only the cyclic collector frees, which the rollout's GC tuning
        runs rarely, so each finished episode's arrays would pile up in the oldest generation."""
        return [self.check_history, self.answer_malformed_tool_calls]

    def init_agent(self, agent: Any) -> None:
        """Trim each model call's messages (the tool-call hook is registered by Strands from ``@hook``)."""
        self.model._attached_agents.add(agent)
        if InvokeModelStage is not None:
            agent.add_middleware(InvokeModelStage.Input, self._send_only_new_messages)

    @hook
    def check_history(self, event: BeforeInvocationEvent) -> None:
        """Check the agent's history against what the model read (edits between invocations)."""
        self.model.check_history(event.agent)

    @hook
    def answer_malformed_tool_calls(self, event: BeforeToolCallEvent) -> None:
        """Cancel a malformed call with the parser's explanation (an error tool result)."""
        message = self.model.take_tool_call_error(str(event.tool_use.get("toolUseId")))
        if message is not None:
            event.cancel_tool = message

    def _send_only_new_messages(self, context: InvokeModelContext) -> InvokeModelContext:
        """Hand the model only the messages from its last output on (its ``messages`` are already
        Strands' copy); the whole list when a span records or the model finds no output of its own."""
        if context.model is not self.model:
            return context
        position = self.model.trim_point(context.agent, context.messages, whole=_span_records())
        if position is None:
            return context
        return context.replace(messages=context.messages[position:])


def _span_records() -> bool:
    """Whether an OpenTelemetry span records here (Strands' model-call span would then record too)."""
    return otel_trace is not None and otel_trace.get_current_span().is_recording()
