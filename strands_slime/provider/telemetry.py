"""Strands' tracer without the work nobody sees.

On every agent cycle Strands' tracer maps and JSON-serializes the whole conversation
(``Tracer._add_event_messages``) for the cycle's span, even when that span does not record (no
OpenTelemetry SDK or sampler configured, the rollout's normal case), where OpenTelemetry drops the
result. That is O(history) per turn: about 8 % of a rollout's CPU per agent turn in our provider
benchmark. :func:`skip_messages_of_unrecorded_spans` makes the tracer skip that work for spans that do
not record and do everything as before for spans that do, so traces are unchanged.

It wraps one private method of Strands' ``Tracer``. When a Strands release renames it, nothing is
wrapped and Strands runs as it ships (:func:`messages_of_unrecorded_spans_skipped` tells which).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

logger = logging.getLogger(__name__)

_GUARD_MARKER = "__strands_slime_skips_unrecorded__"
_METHOD = "_add_event_messages"


def skip_messages_of_unrecorded_spans() -> bool:
    """Make Strands' tracer skip serializing messages for spans that do not record (once per process).

    Returns:
        True when the guard is in place (now or from an earlier call), False when this Strands has no
        method to guard.
    """
    try:
        from strands.telemetry.tracer import Tracer
    except ImportError:  # pragma: no cover - Strands is a dependency
        return False
    original = getattr(Tracer, _METHOD, None)
    if original is None or not callable(original):
        logger.debug("strands.telemetry.tracer.Tracer has no %s; its message serialization stays on", _METHOD)
        return False
    if getattr(original, _GUARD_MARKER, False):
        return True

    @functools.wraps(original)
    def add_event_messages(self: Any, span: Any, messages: Any, *rest: Any, **options: Any) -> Any:
        if span is None or not span.is_recording():
            return None  # OpenTelemetry would drop every event and attribute of this span
        return original(self, span, messages, *rest, **options)

    setattr(add_event_messages, _GUARD_MARKER, True)
    setattr(Tracer, _METHOD, add_event_messages)
    return True


def messages_of_unrecorded_spans_skipped() -> bool:
    """Whether Strands' tracer currently skips serializing messages for spans that do not record."""
    try:
        from strands.telemetry.tracer import Tracer
    except ImportError:  # pragma: no cover - Strands is a dependency
        return False
    return bool(getattr(getattr(Tracer, _METHOD, None), _GUARD_MARKER, False))
