"""Fault injection for ``/generate`` (a ``/dev/`` test hook SGLang does not have).

Queued faults hit the next requests in order; a seeded fault mix draws one per request after them.
A fault delays, answers with an error status, drops the connection or cuts the reply body.
"""

from __future__ import annotations

import asyncio
import collections
import random
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from strands_slime.devserver.protocol import ProtocolError


class DroppedConnection(Exception):
    """Raised inside a handler after the socket was closed on purpose."""


class Fault(BaseModel):
    """What the next ``count`` ``/generate`` requests suffer (delay first, then status or drop).

    ``cut_body`` lets the request run, then cuts its reply: ``"truncate"`` sends half the JSON as a
    complete 200 response, ``"reset"`` announces the full length, sends half and resets the socket.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    count: int = Field(1, ge=1)
    status: int | None = Field(None, ge=400, le=599)
    message: str | None = None
    drop_connection: bool = False
    delay_s: float = Field(0.0, ge=0)
    cut_body: Literal["truncate", "reset"] | None = None

    @model_validator(mode="after")
    def _one_effect(self) -> Fault:
        effects = (self.drop_connection, self.status is not None, self.cut_body is not None)
        if sum(effects) > 1:
            raise ValueError(
                "a fault drops the connection, answers with a status or cuts the body: one of them"
            )
        if not any(effects) and not self.delay_s:
            raise ValueError("a fault needs status, drop_connection, delay_s or cut_body")
        return self

    @classmethod
    def from_obj(cls, obj: Any) -> Fault:
        """Validate a fault spec (the ``POST /dev/faults`` JSON object).

        Raises:
            ValueError: naming the bad key or value.
        """
        try:
            return cls.model_validate(obj)
        except ValidationError as exc:
            raise ValueError("; ".join(_describe(error) for error in exc.errors(include_url=False))) from None

    def label(self) -> str:
        """A short name for the request log: ``503``, ``drop``, ``cut:reset``, ``delay:1.5+500``, ..."""
        kind = str(self.status) if self.status is not None else "drop" if self.drop_connection else ""
        parts = (
            f"delay:{self.delay_s:g}" if self.delay_s else "",
            kind,
            f"cut:{self.cut_body}" if self.cut_body else "",
        )
        return "+".join(part for part in parts if part)

    def error(self) -> ProtocolError:
        """The error reply SGLang sends for this fault's status."""
        assert self.status is not None
        default = (
            "The request queue is full." if self.status == 503 else f"Injected fault (HTTP {self.status})."
        )
        return ProtocolError.for_status(self.status, self.message or default)


def _describe(error: Any) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()))
    return f"{where}: {error.get('msg')}" if where else str(error.get("msg"))


class WeightedFault(Fault):
    """A fault mix entry: a fault spec plus its probability per request."""

    weight: float = Field(gt=0, le=1)


class FaultMix:
    """A seeded draw per ``/generate`` request: fault ``i`` with probability ``weight_i``.

    A drawn fault with ``count`` > 1 is a burst: it also hits the next ``count - 1`` requests.

    Raises:
        ValueError: for a bad entry, or weights adding up to more than 1.
    """

    def __init__(self, faults: list[Any], seed: int = 0) -> None:
        if not isinstance(faults, list) or not faults:
            raise ValueError('a fault mix is a non-empty list of faults with a "weight"')
        self.choices = [WeightedFault.from_obj(item) for item in faults]
        if sum(choice.weight for choice in self.choices) > 1 + 1e-9:
            raise ValueError("the weights of a fault mix must add up to at most 1")
        self.seed = seed
        self._rng = random.Random(seed)

    def draw(self) -> Fault | None:
        """The fault for the next request, or None."""
        point = self._rng.random()
        for choice in self.choices:
            if point < choice.weight:
                return Fault.model_validate(choice.model_dump(exclude={"weight"}))
            point -= choice.weight
        return None

    def describe(self) -> dict[str, Any]:
        """The mix as JSON (the ``POST /dev/fault_mix`` reply)."""
        return {
            "seed": self.seed,
            "faults": [choice.model_dump(exclude_unset=True) for choice in self.choices],
        }


class FaultQueue:
    """The faults waiting for the next ``/generate`` requests, then the fault mix, if set."""

    def __init__(self) -> None:
        self._pending: collections.deque[Fault] = collections.deque()
        self.mix: FaultMix | None = None

    def add(self, faults: list[Fault]) -> None:
        """Queue ``faults`` after those already pending."""
        self._pending.extend(faults)

    def clear(self) -> None:
        """Drop every pending fault and the mix."""
        self._pending.clear()
        self.mix = None

    def describe(self) -> list[dict[str, Any]]:
        """The pending faults as JSON, in order."""
        return [fault.model_dump() for fault in self._pending]

    def take(self) -> Fault | None:
        """The fault that hits the request arriving now, or None."""
        if not self._pending and self.mix is not None:
            drawn = self.mix.draw()
            if drawn is not None:
                self._pending.append(drawn)
        if not self._pending:
            return None
        fault = self._pending[0]
        fault.count -= 1
        if fault.count <= 0:
            self._pending.popleft()
        return fault


async def apply_fault(request: web.Request, fault: Fault) -> None:
    """Delay, then drop the connection or raise the fault's error (``cut_body`` acts later).

    Raises:
        DroppedConnection: the socket was closed.
        ProtocolError: the fault's status.
    """
    if fault.delay_s:
        await asyncio.sleep(fault.delay_s)
    if fault.drop_connection:
        transport = request.transport
        if transport is not None:
            transport.abort()
        raise DroppedConnection
    if fault.status is not None:
        raise fault.error()


async def cut_reply(request: web.Request, body: bytes, how: str) -> web.StreamResponse:
    """Send half of ``body``: as a complete reply (``truncate``) or then reset the socket (``reset``).

    Raises:
        DroppedConnection: after a ``reset``.
    """
    half = body[: len(body) // 2]
    if how == "truncate":
        return web.Response(body=half, content_type="application/json")
    reply = web.StreamResponse(headers={"Content-Type": "application/json"})
    reply.content_length = len(body)
    await reply.prepare(request)
    await reply.write(half)
    if request.transport is not None:
        request.transport.abort()
    raise DroppedConnection
