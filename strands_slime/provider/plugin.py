"""The Strands plugin an agent needs to drive an :class:`~strands_slime.provider.model.SGLangModel`.

``Agent(model=model, plugins=[model.plugin()], ...)``. A model provider cannot reach the agent's hooks
or middleware through Strands' model API, so what token-in/token-out needs of the agent loop is one
explicit plugin instead of something the model installs behind the caller's back: malformed tool calls
answered with the parser's explanation, only new messages handed to the model (the whole call when an
OpenTelemetry span records), the running tool call published for sub-agents, and edits of
``agent.messages`` found once per invocation. A model used without it stays exact and warns once.
Details: docs/provider.md, "The plugin".
"""

from __future__ import annotations

import logging
from typing import Any

from strands.hooks import AfterToolCallEvent, BeforeInvocationEvent, BeforeToolCallEvent
from strands.plugins import Plugin

from strands_slime.runtime import get_runtime

try:  # Strands >= 1.62: middleware around each model call
    from strands.middleware import InvokeModelContext, InvokeModelStage
except ImportError:  # pragma: no cover - depends on the installed Strands
    InvokeModelContext = InvokeModelStage = None  # type: ignore[assignment,misc]

try:  # a dependency of Strands
    from opentelemetry import trace as otel_trace
except ImportError:  # pragma: no cover - depends on the environment
    otel_trace = None  # type: ignore[assignment]

__all__ = ["TITOPlugin", "warn_without_plugin"]

logger = logging.getLogger(__name__)


class TITOPlugin(Plugin):
    """What one :class:`~strands_slime.provider.model.SGLangModel` needs of the agent that drives it
    (see the module docstring). The model module imports this one, so the model is not typed here.

    Its hooks and middleware are registered in :meth:`init_agent` through the agent's public API
    (``add_hook``, ``add_middleware``), as Strands documents for plugins with custom initialization; the
    plugin keeps no bound method of its own, so it forms no reference cycle with its model."""

    name = "strands-slime-tito"

    def __init__(self, model: Any) -> None:
        # Plugin.__init__ only discovers @hook and @tool methods (a walk of the class, ~0.2 ms an
        # episode); this plugin has none, and says so through the public properties below.
        self.model = model

    @property
    def hooks(self) -> list[Any]:
        """None to discover: :meth:`init_agent` registers them."""
        return []

    @property
    def tools(self) -> list[Any]:
        """The plugin adds no tools."""
        return []

    def init_agent(self, agent: Any) -> None:
        """Bind the model to ``agent`` (a call from no agent loop is then a side call, also before the
        agent's first call) and register the hooks and the middleware."""
        self.model.history.attached.add(agent)
        agent.add_hook(self.check_history, BeforeInvocationEvent)
        agent.add_hook(self.answer_malformed_tool_calls, BeforeToolCallEvent)
        agent.add_hook(self.end_tool_call, AfterToolCallEvent)
        if InvokeModelStage is not None:
            agent.add_middleware(InvokeModelStage.Input, self.send_only_new_messages)

    def check_history(self, event: BeforeInvocationEvent) -> None:
        """Check the agent's history against what the model read (edits between invocations)."""
        self.model.check_history(event.agent)

    def answer_malformed_tool_calls(self, event: BeforeToolCallEvent) -> None:
        """Cancel a malformed call with the parser's explanation (an error tool result); publish the
        call to the context its tool runs in (what a sub-agent records as its origin)."""
        tool_use_id = str(event.tool_use.get("toolUseId"))
        self.model.lane.tool_call_started(tool_use_id)
        message = self.model.calls.take_error(tool_use_id)
        if message is not None:
            event.cancel_tool = message

    def end_tool_call(self, event: AfterToolCallEvent) -> None:
        """The tool call ended: its context is back under the call it replaced."""
        self.model.lane.tool_call_ended(str(event.tool_use.get("toolUseId")))

    def send_only_new_messages(self, context: InvokeModelContext) -> InvokeModelContext:
        """Hand the model only the messages from its last output on (its ``messages`` are already
        Strands' copy); the whole list when a span records or the model finds no output of its own."""
        if context.model is not self.model:
            return context
        position = self.model.history.trim_point(context.agent, context.messages, whole=_span_records())
        if position is None:
            return context
        return context.replace(messages=context.messages[position:])


def _span_records() -> bool:
    """Whether an OpenTelemetry span records here (Strands' model-call span would then record too)."""
    return otel_trace is not None and otel_trace.get_current_span().is_recording()


def warn_without_plugin() -> None:
    """Say once per process (a loop that builds a model per episode would repeat it) what a model
    driven by an agent without its plugin misses."""
    if get_runtime().first_time("SGLangModel without its plugin"):
        logger.warning(
            "SGLangModel is used without its plugin: pass Agent(..., plugins=[model.plugin()]) so that "
            "malformed tool calls get the parser's explanation instead of running with {}, each call "
            "reads only new messages, and edits to agent.messages between invocations are found (the "
            "trajectory is exact either way)"
        )
