"""The ``/dev/`` test hooks SGLang does not have: the ``/generate`` request log and fault injection.

One :class:`TestHooks` wraps whatever answers ``/generate``: the dev server's own engine, or a real
SGLang server behind :class:`~strands_slime.devserver.proxy.FaultProxy`. Both then offer the same
``GET/DELETE /dev/requests``, ``/dev/faults`` and ``/dev/fault_mix`` (docs/devserver.md, "Test hooks").
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from strands_slime.devserver.faults import (
    DroppedConnection,
    Fault,
    FaultMix,
    FaultQueue,
    apply_fault,
    cut_reply,
)
from strands_slime.devserver.protocol import ProtocolError
from strands_slime.devserver.request_log import RequestLog, redacted_headers

Reply = tuple[int, bytes]
"""An HTTP status and a JSON body."""


def dumps(obj: Any) -> str:
    """Compact JSON, as SGLang writes it (NaN/inf refused)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def json_reply(body: Any, status: int = 200) -> web.Response:
    """A JSON response."""
    return web.json_response(body, status=status, dumps=dumps)


def error_reply(exc: ProtocolError) -> web.Response:
    """SGLang's error body and status for ``exc``."""
    return json_reply(exc.body, exc.status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def refusing(handler: Handler) -> Handler:
    """``handler``, answering a :class:`ProtocolError` it raises with SGLang's status and body."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ProtocolError as exc:
            return error_reply(exc)

    return handle


async def json_body(request: web.Request) -> Any:
    """The decoded body; an empty body is ``{}``.

    Raises:
        ProtocolError: the body is not JSON (an E1 400).
    """
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ProtocolError.pydantic(f"JSON decode error: {exc}") from None


class TestHooks:
    """The request log and the fault queue/mix around one ``/generate`` producer.

    ``record_replies`` also keeps each reply's body in the log (``"reply"``): what a proxy saw the
    server answer, for tests that compare a client's view with the server's."""

    __test__ = False  # not a pytest class

    def __init__(self, request_log_size: int = 10_000, *, record_replies: bool = False) -> None:
        if request_log_size < 1:
            raise ValueError(f"request_log_size must be >= 1, got {request_log_size}")
        self.log = RequestLog(request_log_size)
        self.faults = FaultQueue()
        self.record_replies = record_replies

    @property
    def request_log(self) -> list[dict[str, Any]]:
        """Every received ``/generate`` request, oldest first: ``{"json", "headers", "status", "time"}``."""
        return self.log.entries()

    def clear_request_log(self) -> None:
        """Forget the logged requests."""
        self.log.clear()

    def inject_fault(self, **spec: Any) -> None:
        """Make the next ``count`` ``/generate`` requests fail (``status``, ``drop_connection``,
        ``cut_body``) or wait ``delay_s`` (:class:`Fault` has the fields).

        Raises:
            ValueError: an invalid fault.
        """
        self.faults.add([Fault.from_obj(spec)])

    def clear_faults(self) -> None:
        """Drop the pending faults and the fault mix."""
        self.faults.clear()

    def set_fault_mix(self, faults: list[dict[str, Any]], seed: int = 0) -> None:
        """From now on every ``/generate`` request draws a fault from ``faults`` (each with a ``weight``).

        Raises:
            ValueError: an invalid mix (see :class:`FaultMix`).
        """
        self.faults.mix = FaultMix(faults, seed)

    async def serve(
        self, request: web.Request, produce: Callable[[bytes], Awaitable[Reply]]
    ) -> web.StreamResponse:
        """Log the request, apply the fault it draws, and answer with ``produce(raw_body)``."""
        entry = self.log.add(redacted_headers(request))
        try:
            raw = await request.read()
            self.log.set_body(entry, raw)
            fault = self.faults.take()
            if fault is not None:
                entry.fault = fault.label()
                await apply_fault(request, fault)
            status, body = await produce(raw)
            entry.status = status
            if self.record_replies:
                entry.reply = body
            if fault is not None and fault.cut_body is not None and status == 200:
                return await cut_reply(request, body, fault.cut_body)
            return web.Response(body=body, status=status, content_type="application/json")
        except ProtocolError as exc:
            entry.status = exc.status
            return error_reply(exc)
        except DroppedConnection:
            raise asyncio.CancelledError from None

    def routes(self) -> list[web.RouteDef]:
        """``/dev/requests``, ``/dev/faults`` and ``/dev/fault_mix``."""
        return [
            web.get("/dev/requests", self._handle_requests),
            web.delete("/dev/requests", self._handle_requests_clear),
            web.get("/dev/faults", self._handle_faults),
            web.post("/dev/faults", refusing(self._handle_faults_add)),
            web.delete("/dev/faults", self._handle_faults_clear),
            web.post("/dev/fault_mix", refusing(self._handle_fault_mix)),
        ]

    async def _handle_requests(self, request: web.Request) -> web.Response:
        return json_reply(self.request_log)

    async def _handle_requests_clear(self, request: web.Request) -> web.Response:
        return json_reply({"cleared": self.log.clear()})

    async def _handle_faults(self, request: web.Request) -> web.Response:
        return json_reply(self.faults.describe())

    async def _handle_faults_add(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        try:
            self.faults.add([Fault.from_obj(item) for item in (body if isinstance(body, list) else [body])])
        except ValueError as exc:
            return error_reply(ProtocolError.value(f"bad fault: {exc}"))
        return json_reply({"pending": self.faults.describe()})

    async def _handle_faults_clear(self, request: web.Request) -> web.Response:
        self.clear_faults()
        return json_reply({"pending": []})

    async def _handle_fault_mix(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        try:
            if not isinstance(body, dict) or type(body.get("seed", 0)) is not int:
                raise ValueError('send {"faults": [...], "seed": N} with an integer seed')
            self.set_fault_mix(body.get("faults"), body.get("seed", 0))
        except ValueError as exc:
            return error_reply(ProtocolError.value(f"bad fault mix: {exc}"))
        return json_reply(self.faults.mix.describe() if self.faults.mix else {})
