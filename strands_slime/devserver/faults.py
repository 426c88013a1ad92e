"""Fault injection for ``/generate`` (a ``/dev/`` test hook SGLang does not have).

Queued faults hit the next requests in order; a seeded fault mix draws one per request after them.
A fault delays, answers with an error status, drops the connection or cuts the reply body.
"""

from __future__ import annotations

import asyncio
import collections
import random
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from strands_slime.devserver.protocol import ProtocolError


class DroppedConnection(Exception):
    """Raised inside a handler after the socket was closed on purpose."""


@dataclass(slots=True)
class Fault:
    """What the next ``count`` ``/generate`` requests suffer (delay first, then status or drop).

    ``cut_body`` lets the request run, then cuts its reply: ``"truncate"`` sends half the JSON as a
    complete 200 response, ``"reset"`` announces the full length, sends half and resets the socket.
    """

    count: int = 1
    status: int | None = None
    message: str | None = None
    drop_connection: bool = False
    delay_s: float = 0.0
    cut_body: str | None = None

    @classmethod
    def from_obj(cls, obj: Any) -> Fault:
        """Validate a fault spec (the ``POST /dev/faults`` JSON object).

        Raises:
            ValueError: naming the bad key or value.
        """
        if not isinstance(obj, dict):
            raise ValueError('a fault must be a JSON object, e.g. {"status": 503, "count": 3}')
        unknown = set(obj) - {"count", "status", "message", "drop_connection", "delay_s", "cut_body"}
        if unknown:
            raise ValueError(
                f"unknown fault keys {sorted(unknown)} "
                "(use count, status, message, drop_connection, delay_s, cut_body)"
            )
        count = obj.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"count must be an integer >= 1, got {count!r}")
        status = obj.get("status")
        if status is not None and (
            not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599
        ):
            raise ValueError(f"status must be an HTTP error status in [400, 599], got {status!r}")
        message = obj.get("message")
        if message is not None and not isinstance(message, str):
            raise ValueError(f"message must be a string, got {message!r}")
        drop = obj.get("drop_connection", False)
        if not isinstance(drop, bool):
            raise ValueError(f"drop_connection must be true or false, got {drop!r}")
        delay = obj.get("delay_s", 0.0)
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0:
            raise ValueError(f"delay_s must be a number >= 0, got {delay!r}")
        cut = obj.get("cut_body")
        if cut not in (None, "truncate", "reset"):
            raise ValueError(f"cut_body must be 'truncate' or 'reset', got {cut!r}")
        if sum((drop, status is not None, cut is not None)) > 1:
            raise ValueError(
                "a fault drops the connection, answers with a status or cuts the body: one of them"
            )
        if not drop and status is None and not delay and cut is None:
            raise ValueError("a fault needs status, drop_connection, delay_s or cut_body")
        return cls(
            count=count,
            status=status,
            message=message,
            drop_connection=drop,
            delay_s=float(delay),
            cut_body=cut,
        )

    def describe(self) -> dict[str, Any]:
        """The spec as JSON (``GET /dev/faults``)."""
        return {
            "count": self.count,
            "status": self.status,
            "message": self.message,
            "drop_connection": self.drop_connection,
            "delay_s": self.delay_s,
            "cut_body": self.cut_body,
        }

    def label(self) -> str:
        """A short name for the request log: ``503``, ``drop``, ``cut:reset``, ``delay:1.5+500``, ..."""
        kind = (
            str(self.status)
            if self.status is not None
            else "drop"
            if self.drop_connection
            else f"cut:{self.cut_body}"
            if self.cut_body
            else ""
        )
        delay = f"delay:{self.delay_s:g}" if self.delay_s else ""
        return "+".join(part for part in (delay, kind) if part)

    def error(self) -> ProtocolError:
        """The error reply SGLang sends for this fault's status."""
        assert self.status is not None
        default = (
            "The request queue is full." if self.status == 503 else f"Injected fault (HTTP {self.status})."
        )
        return ProtocolError.for_status(self.status, self.message or default)


class FaultMix:
    """A seeded draw per ``/generate`` request: fault ``i`` with probability ``weight_i``.

    A drawn fault with ``count`` > 1 is a burst: it also hits the next ``count - 1`` requests.
    """

    def __init__(self, faults: list[Any], seed: int = 0) -> None:
        """Validate the entries (each a fault spec plus a ``weight``).

        Raises:
            ValueError: for a bad entry, or weights adding up to more than 1.
        """
        if not isinstance(faults, list) or not faults:
            raise ValueError('a fault mix is a non-empty list of faults with a "weight"')
        self.choices: list[tuple[float, dict[str, Any]]] = []
        for item in faults:
            if not isinstance(item, dict):
                raise ValueError(f"a fault mix entry must be an object, got {item!r}")
            spec = dict(item)
            weight = spec.pop("weight", None)
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not 0 < weight <= 1:
                raise ValueError(f"each fault mix entry needs a weight in (0, 1], got {weight!r}")
            Fault.from_obj(spec)  # validates
            self.choices.append((float(weight), spec))
        if sum(weight for weight, _ in self.choices) > 1 + 1e-9:
            raise ValueError("the weights of a fault mix must add up to at most 1")
        self.seed = seed
        self._rng = random.Random(seed)

    def draw(self) -> Fault | None:
        """The fault for the next request, or None."""
        point = self._rng.random()
        for weight, spec in self.choices:
            if point < weight:
                return Fault.from_obj(spec)
            point -= weight
        return None

    def describe(self) -> dict[str, Any]:
        """The mix as JSON (the ``POST /dev/fault_mix`` reply)."""
        return {"seed": self.seed, "faults": [{"weight": w, **spec} for w, spec in self.choices]}


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
        return [fault.describe() for fault in self._pending]

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
