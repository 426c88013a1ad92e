"""The bodies of SGLang's control endpoints: abort, pause/continue, weight updates, cache flush.

Each ``parse_*`` validates a decoded JSON body as SGLang's pydantic model would and raises
:class:`ProtocolError` (an E1 400) naming the bad field; the routes in app.py then act on the
scheduler. Weight updates only move the version: the weights themselves never change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strands_slime.devserver.protocol import ProtocolError

FLUSHED_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
"""SGLang's ``/flush_cache`` success text."""
FLUSH_FAILED_TEXT = "Flush cache failed.\n"
"""SGLang's ``/flush_cache`` reply while requests are live."""
PAUSED = {"message": "Generation paused successfully.", "status": "ok"}
CONTINUED = {"message": "Generation continued successfully.", "status": "ok"}
WEIGHT_SOURCES = ("disk", "tensor", "distributed")
"""The ``/update_weights_from_{source}`` routes."""
_WEIGHT_UPDATE_REQUIRED = {
    "disk": ("model_path",),
    "tensor": ("serialized_named_tensors",),
    "distributed": ("names", "dtypes", "shapes"),
}
_WEIGHT_UPDATE_MESSAGES = {
    "disk": "Succeeded to update model weights.",
    "tensor": "Succeeded to update model weights.",
    "distributed": "Succeeded to update parameter online.",
}


def _as_dict(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ProtocolError.pydantic("Input should be a valid dictionary")
    return body


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ProtocolError.pydantic(f"{name}: Input should be a valid boolean, got {value!r}")
    return value


def parse_abort(body: Any) -> tuple[str | None, bool]:
    """``/abort_request``: ``(rid, abort_all)``.

    Raises:
        ProtocolError: a non-object body, a non-string ``rid`` or a non-boolean ``abort_all``.
    """
    body = _as_dict(body)
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError.pydantic(f"rid: Input should be a valid string, got {rid!r}")
    return rid, _flag(body, "abort_all", False)


def parse_pause(body: Any) -> None:
    """``/pause_generation``: only SGLang's default ``mode: "abort"`` (what slime sends) is emulated.

    Raises:
        ProtocolError: an unknown mode (SGLang's Literal field, an E1 400), or ``in_place`` /
            ``retract``, which SGLang has but the dev server does not implement.
    """
    mode = _as_dict(body).get("mode", "abort")
    if mode in ("retract", "in_place"):
        raise ProtocolError.value(
            f"The dev server does not implement pause_generation mode {mode!r}; "
            "only mode 'abort' (the default) is emulated."
        )
    if mode != "abort":  # PauseGenerationReqInput.mode's Literal
        raise ProtocolError.pydantic(f"mode: Input should be 'abort', 'retract' or 'in_place', got {mode!r}")


def parse_weight_version(body: Any) -> tuple[str, bool]:
    """``/update_weight_version``: ``(new_version, abort_all_requests)`` (aborting is the default).

    Raises:
        ProtocolError: a missing or empty ``new_version``, or a non-boolean ``abort_all_requests``.
    """
    body = body if isinstance(body, dict) else {}
    version = body.get("new_version")
    if not isinstance(version, str) or not version:
        raise ProtocolError.pydantic("new_version: Field required (a non-empty string)")
    return version, _flag(body, "abort_all_requests", True)


@dataclass(frozen=True, slots=True)
class WeightUpdate:
    """A validated ``/update_weights_from_{disk,tensor,distributed}`` body."""

    source: str
    abort_all_requests: bool
    weight_version: str | None

    def reply(self) -> dict[str, Any]:
        """SGLang's success reply for this source."""
        message = _WEIGHT_UPDATE_MESSAGES[self.source]
        if self.weight_version is not None:
            message += f" Weight version updated to {self.weight_version}."
        reply: dict[str, Any] = {"success": True, "message": message}
        if self.source == "disk":
            reply["num_paused_requests"] = 0
        return reply


def parse_weight_update(source: str, body: Any) -> WeightUpdate:
    """Check SGLang's required fields for ``source``; ``abort_all_requests`` defaults to false.

    Raises:
        ProtocolError: a missing required field or a wrongly typed option.
    """
    body = _as_dict(body)
    missing = [name for name in _WEIGHT_UPDATE_REQUIRED[source] if name not in body]
    if missing:
        raise ProtocolError.pydantic(f"{missing[0]}: Field required")
    version = body.get("weight_version")
    if version is not None and not isinstance(version, str):
        raise ProtocolError.pydantic("weight_version: Input should be a valid string")
    return WeightUpdate(source, _flag(body, "abort_all_requests", False), version)
