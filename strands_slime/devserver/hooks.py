"""The ``/dev/`` test hooks SGLang does not have: the ``/generate`` request log, and a place to plug more.

One :class:`TestHooks` wraps whatever answers ``/generate`` (the dev server's engine). Its plugins wrap
each answer: the fault injection the tests and the soak use (``benchmarks/fault_injection.py``, outside
the package) is one.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from strands_slime.devserver.protocol import ProtocolError
from strands_slime.devserver.request_log import LoggedRequest, RequestLog

Reply = tuple[int, bytes]
"""An HTTP status and a JSON body."""


class HookPlugin(Protocol):
    """Put around every ``/generate`` answer (``around`` awaits ``answer()``, normally), with ``/dev/``
    routes of its own (added when the server starts; a plugin added later serves in-process only)."""

    async def around(
        self, request: web.Request, entry: LoggedRequest, answer: Callable[[], Awaitable[Reply]]
    ) -> Reply | web.StreamResponse:
        """Answer ``request``; ``entry`` is its log entry (``entry.notes`` show in the log)."""

    def routes(self) -> list[web.RouteDef]:
        """The plugin's ``/dev/`` routes."""


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
    """The request log and the plugins around one ``/generate`` producer."""

    __test__ = False  # not a pytest class

    def __init__(self, request_log_size: int = 10_000) -> None:
        if request_log_size < 1:
            raise ValueError(f"request_log_size must be >= 1, got {request_log_size}")
        self.log = RequestLog(request_log_size)
        self.plugins: list[HookPlugin] = []

    @property
    def request_log(self) -> list[dict[str, Any]]:
        """Every received ``/generate`` request, oldest first: ``{"json", "headers", "status", "time"}``."""
        return self.log.entries()

    def clear_request_log(self) -> None:
        """Forget the logged requests."""
        self.log.clear()

    async def serve(
        self, request: web.Request, produce: Callable[[bytes], Awaitable[Reply]]
    ) -> web.StreamResponse:
        """Log the request and answer with ``produce(raw_body)``, through the plugins."""
        entry = self.log.add(request.headers, await request.read())

        async def answer() -> Reply:
            try:
                status, body = await produce(entry.raw)
            except ProtocolError as exc:
                status, body = exc.status, dumps(exc.body).encode()
            entry.status = status
            return status, body

        for plugin in reversed(self.plugins):
            answer = functools.partial(plugin.around, request, entry, answer)  # type: ignore[assignment]
        try:
            reply = await answer()
        except ProtocolError as exc:  # a plugin's own error reply
            entry.status = exc.status
            return error_reply(exc)
        if isinstance(reply, web.StreamResponse):
            return reply
        return web.Response(body=reply[1], status=reply[0], content_type="application/json")

    def routes(self) -> list[web.RouteDef]:
        """``GET/DELETE /dev/requests``, and the plugins' routes."""
        return [
            web.get("/dev/requests", self._handle_requests),
            web.delete("/dev/requests", self._handle_requests_clear),
            *(route for plugin in self.plugins for route in plugin.routes()),
        ]

    async def _handle_requests(self, request: web.Request) -> web.Response:
        return json_reply(self.request_log)

    async def _handle_requests_clear(self, request: web.Request) -> web.Response:
        return json_reply({"cleared": self.log.clear()})
