"""What crosses between the episode executor and its workers, whatever carries it (pipes, Ray).

Every message is a tuple whose first item names it, pickled with protocol 5 (:func:`encode`); the local
transport frames each with an 8-byte length on a pipe (:func:`frame`), the Ray transport passes the same
bytes as an actor call's argument or result. Sample fields cross in plain form (:func:`pack_fields`):
long number lists as ``array`` blocks (one memcpy to unpickle instead of an object per token on slime's
loop), the status by name, info dataclasses as dicts; :func:`apply_result` writes them back onto the
receiving side's own ``Sample``.

Parent to worker: ``("init", (args_fields, config))``, ``("run", episode_id, channel, flag, inputs,
sampling_params, evaluation, kept)``, ``("abort", channel, version, aborted, parent_time)``,
``("drop", channel)``, ``("cancel", episode_id)``, ``("stop",)``. Worker to parent: ``("ready", pid,
node)``, ``("init_error", category, text)``, ``("done", episode_id, results)``, ``("config_error",
episode_id, text)``, ``("error", episode_id, text)``, ``("codec", seconds)``, ``("abort_seen", channel,
aborted, parent_time, worker_time)``. Abort changes carry a per-channel version (and every ``run``
carries its channel's version at dispatch), so a worker applies them in the parent's order even when the
transport does not keep it (Ray runs an async actor's calls in any order).
"""

from __future__ import annotations

import array
import dataclasses
import pickle
import struct
from collections.abc import AsyncIterator
from typing import Any, Protocol

from strands_slime.rollout import slime_compat

OPTIONAL_SAMPLE_ATTRIBUTES: tuple[str, ...] = ("trace",)
"""Carried both ways when the sample has them: slime's trace carrier (``sglang_generate`` spans)."""

HEADER = struct.Struct("<Q")
"""The length before every message on a pipe."""
PICKLE_PROTOCOL = 5

_INT_ARRAYS = ("tokens", "loss_mask", "rollout_top_p_token_ids", "rollout_top_p_token_offsets")
_FLOAT_ARRAYS = ("rollout_log_probs", "teacher_log_probs")


def encode(message: Any) -> bytes:
    """One message as bytes (a pickle, protocol 5)."""
    return pickle.dumps(message, protocol=PICKLE_PROTOCOL)


def frame(payload: bytes) -> bytes:
    """An :func:`encode`-d message as it goes on a pipe: its length, then its bytes."""
    return HEADER.pack(len(payload)) + payload


def unpicklable(fields: dict[str, Any], prefix: str) -> str:
    """Name the first field that cannot be pickled (for a one-line ``ConfigError``)."""
    for name, value in fields.items():
        try:
            pickle.dumps(value, protocol=PICKLE_PROTOCOL)
        except Exception as exc:
            return f"{prefix}{name} ({type(value).__name__}) cannot be sent to a worker process ({type(exc).__name__})"
    return f"{prefix}* cannot be sent to a worker process"


def _as_array(value: Any, typecode: str) -> Any:
    """A long list of numbers as an ``array``: pickled as one block of bytes, not one object per item
    (16k tokens: a memcpy instead of 16k ints to build on slime's loop). Anything else stays as is."""
    if type(value) is not list or len(value) < 64:
        return value
    for code in ("i", "q") if typecode == "i" else (typecode,):
        try:
            return array.array(code, value)
        except OverflowError:  # ids past 2**31: the 8-byte form
            continue
        except TypeError:  # not all numbers of that kind: ship the list
            return value
    return value


def pack_fields(sample: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The ``names`` attributes of ``sample`` it has, in plain picklable form, either way across:
    long number lists as arrays, the status by name, info dataclasses as dicts
    (:func:`apply_result` turns them back)."""
    fields: dict[str, Any] = {}
    for name in names:
        if not hasattr(sample, name):
            continue
        value = getattr(sample, name)
        if name in _INT_ARRAYS:
            value = _as_array(value, "i")
        elif name in _FLOAT_ARRAYS:
            value = _as_array(value, "d")
        elif name == "status":
            value = value.name if hasattr(value, "name") else str(value).upper()
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        fields[name] = value
    return fields


def apply_result(sample: Any, fields: dict[str, Any]) -> None:
    """Write :func:`pack_fields`' output onto slime's (or the stand-in's, or a worker's) own sample."""
    for name, value in fields.items():
        if type(value) is array.array:
            value = value.tolist()
        if name == "status":
            sample.status = slime_compat.status(sample, value)
        elif name in ("spec_info", "prefix_cache_info") and isinstance(value, dict):
            current = getattr(sample, name, None)
            setattr(sample, name, type(current)(**value) if current is not None else value)
        else:
            setattr(sample, name, value)


class WorkerLink(Protocol):
    """One worker as the executor reaches it: a local process on pipes, or a Ray actor."""

    def describe(self, pid: int | None, where: str | None) -> str:
        """Who the worker is, for messages: ``pid 1234``, ``Ray actor 1a2b3c4d, pid 1234 on node ...``."""
        ...

    def send(self, kind: str, payload: bytes) -> None:
        """Send one :func:`encode`-d message of that kind; nothing once the worker is gone."""
        ...

    def replies(self) -> AsyncIterator[bytes]:
        """The worker's messages, in arrival order; ends when the worker is gone."""
        ...

    async def death(self) -> str:
        """How the worker ended (``killed by SIGKILL``, ``its node has died``), once :meth:`replies` ended."""
        ...

    async def stop(self, grace_s: float) -> None:
        """Ask the worker to exit, kill it after ``grace_s``; returns once it is gone."""
        ...

    def kill(self) -> None:
        """Kill the worker now, without the event loop (must not block for long)."""
        ...

    def release(self) -> None:
        """Free what the link holds on the executor's loop once the worker is gone (run on that loop)."""
        ...

    def running(self) -> bool:
        """Whether a killed worker may still run here (a local process not yet gone)."""
        ...
