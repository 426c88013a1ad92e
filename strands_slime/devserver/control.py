"""The bodies of SGLang's control endpoints: abort, pause, weight updates.

Each is parsed with pydantic as SGLang does (a bad body is a 400); the routes in app.py then act on the
scheduler. Weight updates only move the version: the weights themselves never change.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from strands_slime.devserver.protocol import validation_error

FLUSHED_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
"""SGLang's ``/flush_cache`` success text (``Flush cache failed.\\n`` while requests are live)."""
PAUSED = {"message": "Generation paused successfully.", "status": "ok"}
CONTINUED = {"message": "Generation continued successfully.", "status": "ok"}

Body = TypeVar("Body", bound=BaseModel)


class AbortRequest(BaseModel):
    """``/abort_request``."""

    rid: str | None = None
    abort_all: bool = False


class PauseGeneration(BaseModel):
    """``/pause_generation``: only SGLang's default mode (what slime sends, ``{}``) is emulated."""

    mode: Literal["abort"] = "abort"


class UpdateWeightVersion(BaseModel):
    """``/update_weight_version``: aborting in-flight requests is the default."""

    new_version: str
    abort_all_requests: bool = True


class UpdateWeights(BaseModel):
    """``/update_weights_from_{disk,tensor,distributed}``: SGLang's required fields, no abort by default."""

    abort_all_requests: bool = False
    weight_version: str | None = None


class FromDisk(UpdateWeights):
    """``/update_weights_from_disk``."""

    model_path: str


class FromTensor(UpdateWeights):
    """``/update_weights_from_tensor``."""

    serialized_named_tensors: Any


class FromDistributed(UpdateWeights):
    """``/update_weights_from_distributed``."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]


WEIGHT_UPDATES: dict[str, tuple[type[UpdateWeights], str]] = {
    "disk": (FromDisk, "Succeeded to update model weights."),
    "tensor": (FromTensor, "Succeeded to update model weights."),
    "distributed": (FromDistributed, "Succeeded to update parameter online."),
}
"""The ``/update_weights_from_{source}`` routes: the body and SGLang's success message."""


def parse_body(model: type[Body], body: Any) -> Body:
    """``body`` as ``model``, or a 400 naming the bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc, model.__name__) from None
