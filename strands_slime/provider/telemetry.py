"""Strands' tracer without the work nobody sees.

Strands' tracer serializes the whole conversation for every cycle's span, even one that does not
record (about 8 % of a rollout's CPU per turn). :func:`skip_messages_of_unrecorded_spans` wraps that
private method of ``Tracer`` to skip it for spans that do not record, so traces are unchanged. It is
process-wide, hence an explicit opt-in, and version-guarded (:data:`VERIFIED_STRANDS`; any other
release runs as it ships). The upstream change it stands for: docs/provider.md, "Strands' tracer".
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import re
from typing import Any

logger = logging.getLogger(__name__)

_GUARD_MARKER = "__strands_slime_skips_unrecorded__"
_METHOD = "_add_event_messages"
VERIFIED_STRANDS = ((1, 62), (2, 0))
"""Strands releases ``>= 1.62, < 2``: ``Tracer._add_event_messages(self, span, messages, ...)`` there only
adds span events and attributes, which a span that does not record drops."""


@functools.cache
def _strands_version() -> tuple[int, int] | None:
    """The installed Strands' (major, minor), read once (``importlib.metadata`` scans every
    distribution: ~20 ms)."""
    try:
        version = importlib.metadata.version("strands-agents")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - Strands is a dependency
        return None
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def strands_verified() -> bool:
    """Whether the installed Strands is a release the patch was verified against."""
    version = _strands_version()
    low, high = VERIFIED_STRANDS
    return version is not None and low <= version < high


def skip_messages_of_unrecorded_spans() -> bool:
    """Make Strands' tracer skip serializing messages for spans that do not record (once per process).

    Returns:
        True when the guard is in place (now or from an earlier call), False when this Strands is not a
        verified release or has no method to guard.
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
    if not strands_verified():
        logger.debug(
            "Strands %s is outside %s: its tracer is left as it ships", _strands_version(), VERIFIED_STRANDS
        )
        return False

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
