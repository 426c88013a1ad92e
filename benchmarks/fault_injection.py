"""Fault injection for the dev server and for a real SGLang server: a test tool, not part of the package.

The tests and the soak (benchmarks/soak.py) make ``/generate`` fail on purpose: queued faults hit the
next requests in order, a seeded fault mix draws one per request after them. A fault delays, answers
with an error status (SGLang's body for it), drops the connection or cuts the reply body.

- In-process: ``inject_fault(server, status=503, count=2)``, ``set_fault_mix(server, faults, seed)`` and
  ``clear_faults(server)`` work on a ``DevServer``, a ``DevServerThread`` or a :class:`FaultProxy`.
- Over HTTP: ``with_faults(server)`` before it starts adds ``/dev/faults`` and ``/dev/fault_mix``
  (docs/devserver.md, "Fault injection"); ``python -m benchmarks.fault_injection [dev server options]`` (from the repository root)
  serves a dev server with them, ``--upstream URL`` a :class:`FaultProxy` in front of a real server.

The dev server itself only offers the hook these plug into (``TestHooks.plugins``) and its request log.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import random
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from strands_slime.devserver.cli import build_parser, serve_until_stopped, server_from_args, usage_error
from strands_slime.devserver.hooks import TestHooks, json_body, json_reply, refusing
from strands_slime.devserver.protocol import ProtocolError
from strands_slime.devserver.request_log import LoggedRequest

logger = logging.getLogger(__name__)


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
        message = self.message or default
        # SGLang answers a ValueError with 400, an HTTPException with its own status
        return (
            ProtocolError.value(message) if self.status == 400 else ProtocolError.http(message, self.status)
        )


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


# --------------------------------------------------------------------------- plugged into TestHooks


class FaultHooks:
    """The fault queue and mix as a :class:`TestHooks` plugin: ``around`` applies the fault the request
    draws; ``routes`` are ``/dev/faults`` and ``/dev/fault_mix``."""

    def __init__(self) -> None:
        self.queue = FaultQueue()

    async def around(
        self, request: web.Request, entry: LoggedRequest, answer: Callable[[], Awaitable[tuple[int, bytes]]]
    ) -> tuple[int, bytes] | web.StreamResponse:
        """Answer the request (``answer()``) through the fault it draws, if any."""
        fault = self.queue.take()
        if fault is None:
            return await answer()
        entry.notes["fault"] = fault.label()
        try:
            await apply_fault(request, fault)
            status, body = await answer()
            if fault.cut_body is not None and status == 200:
                return await cut_reply(request, body, fault.cut_body)
        except DroppedConnection:
            raise asyncio.CancelledError from None
        return status, body

    def routes(self) -> list[web.RouteDef]:
        """``GET/POST/DELETE /dev/faults`` and ``POST /dev/fault_mix``."""
        return [
            web.get("/dev/faults", self._handle_faults),
            web.post("/dev/faults", refusing(self._handle_faults_add)),
            web.delete("/dev/faults", self._handle_faults_clear),
            web.post("/dev/fault_mix", refusing(self._handle_fault_mix)),
        ]

    async def _handle_faults(self, request: web.Request) -> web.Response:
        return json_reply(self.queue.describe())

    async def _handle_faults_add(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        try:
            self.queue.add([Fault.from_obj(item) for item in (body if isinstance(body, list) else [body])])
        except ValueError as exc:
            return json_reply(ProtocolError.value(f"bad fault: {exc}").body, 400)
        return json_reply({"pending": self.queue.describe()})

    async def _handle_faults_clear(self, request: web.Request) -> web.Response:
        self.queue.clear()
        return json_reply({"pending": []})

    async def _handle_fault_mix(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        try:
            if not isinstance(body, dict) or type(body.get("seed", 0)) is not int:
                raise ValueError('send {"faults": [...], "seed": N} with an integer seed')
            self.queue.mix = FaultMix(body.get("faults"), body.get("seed", 0))
        except ValueError as exc:
            return json_reply(ProtocolError.value(f"bad fault mix: {exc}").body, 400)
        return json_reply(self.queue.mix.describe())


class ReplyRecorder:
    """A :class:`TestHooks` plugin that notes each ``/generate`` reply in the log (``"reply"``) as the
    server sent it (innermost: after the faults, so a request a fault stopped has none)."""

    async def around(
        self, request: web.Request, entry: LoggedRequest, answer: Callable[[], Awaitable[tuple[int, bytes]]]
    ) -> tuple[int, bytes]:
        """Answer, and note the reply (its JSON, else its text)."""
        status, body = await answer()
        try:
            entry.notes["reply"] = json.loads(body)
        except ValueError:
            entry.notes["reply"] = body.decode(errors="replace")
        return status, body

    def routes(self) -> list[web.RouteDef]:
        """None."""
        return []


def _hooks(target: Any) -> TestHooks:
    hooks = getattr(target, "hooks", target)
    if not isinstance(hooks, TestHooks):
        raise TypeError(f"no dev-server test hooks on {type(target).__name__}")
    return hooks


def with_faults(target: Any) -> Any:
    """Plug fault injection into ``target`` (a ``DevServer``, :class:`FaultProxy` or ``TestHooks``) and
    return it; before it starts, this also adds the ``/dev/faults`` routes. Idempotent."""
    hooks = _hooks(target)
    if not any(isinstance(plugin, FaultHooks) for plugin in hooks.plugins):
        hooks.plugins.append(FaultHooks())
    return target


def fault_hooks(target: Any) -> FaultHooks:
    """The :class:`FaultHooks` of ``target``, plugged in on first use."""
    hooks = _hooks(with_faults(target))
    return next(plugin for plugin in hooks.plugins if isinstance(plugin, FaultHooks))


def _on_loop(target: Any, action: Callable[[Any], None]) -> None:
    """Run ``action(server)`` where the server lives: a ``DevServerThread``'s own loop, or here."""
    if hasattr(target, "call") and hasattr(target, "server"):
        server = target.server
        target.call(lambda: action(server))
    else:
        action(target)


def inject_fault(target: Any, **spec: Any) -> None:
    """Make the next ``count`` ``/generate`` requests fail (``status``, ``drop_connection``,
    ``cut_body``) or wait ``delay_s`` (:class:`Fault` has the fields).

    Raises:
        ValueError: an invalid fault.
    """
    fault = Fault.from_obj(spec)
    _on_loop(target, lambda server: fault_hooks(server).queue.add([fault]))


def set_fault_mix(target: Any, faults: list[dict[str, Any]], seed: int = 0) -> None:
    """From now on every ``/generate`` request draws a fault from ``faults`` (each with a ``weight``).

    Raises:
        ValueError: an invalid mix (see :class:`FaultMix`).
    """
    mix = FaultMix(faults, seed)
    _on_loop(target, lambda server: setattr(fault_hooks(server).queue, "mix", mix))


def clear_faults(target: Any) -> None:
    """Drop the pending faults and the fault mix."""
    _on_loop(target, lambda server: fault_hooks(server).queue.clear())


# --------------------------------------------------------------------------- in front of a real server

FORWARDED_HEADERS = ("content-type", "accept", "x-smg-routing-key", "x-smg-target-worker", "authorization")
CLIENT_MAX_SIZE = 512 * 1024 * 1024


class FaultProxy:
    """``async with FaultProxy(upstream) as proxy``: the dev server's ``/dev/`` hooks (request log,
    faults) in front of any SGLang server or router, serving on ``proxy.url``.

    Every request is forwarded unchanged (method, path, query, body, the content type and routing
    headers); ``/generate`` also goes through the hooks, so the soak's fault mix hits a real server as
    it hits the dev server. ``record_replies`` keeps each ``/generate`` reply in the log as the server
    sent it. A client that disconnects closes the forwarded request too (SGLang's abort).
    """

    def __init__(
        self,
        upstream: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        request_log_size: int = 10_000,
        record_replies: bool = False,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.host = host
        self.port = port
        self.hooks = with_faults(TestHooks(request_log_size))
        if record_replies:
            self.hooks.plugins.append(ReplyRecorder())
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def request_log(self) -> list[dict[str, Any]]:
        """Every ``/generate`` request that came through, oldest first (see :class:`TestHooks`)."""
        return self.hooks.request_log

    def inject_fault(self, **fault: Any) -> None:
        """:func:`inject_fault` on this proxy."""
        inject_fault(self, **fault)

    def set_fault_mix(self, faults: list[dict[str, Any]], seed: int = 0) -> None:
        """:func:`set_fault_mix` on this proxy."""
        set_fault_mix(self, faults, seed)

    async def start(self) -> FaultProxy:
        """Bind the port and start forwarding.

        Raises:
            RuntimeError: already started.
            OSError: the port cannot be bound.
        """
        if self._runner is not None:
            raise RuntimeError("this FaultProxy is already started")
        # No pool limit and no timeout of our own: the client in front decides both.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=CLIENT_MAX_SIZE)
        app.add_routes(
            [
                *self.hooks.routes(),
                web.post("/generate", self._handle_generate),
                web.put("/generate", self._handle_generate),
                web.route("*", "/{tail:.*}", self._handle_other),
            ]
        )
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError:
            await runner.cleanup()
            await self._session.close()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        self.url = f"http://{self.host}:{self.port}"
        logger.info("fault proxy on %s forwards to %s", self.url, self.upstream)
        return self

    async def stop(self) -> None:
        """Close the port and the upstream connections."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> FaultProxy:
        """Start the proxy (:meth:`start`)."""
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        """Stop the proxy (:meth:`stop`)."""
        await self.stop()

    async def _forward(self, request: web.Request, body: bytes) -> tuple[int, bytes, str]:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
        async with self._session.request(
            request.method, self.upstream + request.rel_url.path_qs, data=body, headers=headers
        ) as reply:
            return reply.status, await reply.read(), reply.content_type

    async def _handle_generate(self, request: web.Request) -> web.StreamResponse:
        async def produce(raw: bytes) -> tuple[int, bytes]:
            status, body, _ = await self._forward(request, raw)
            return status, body

        return await self.hooks.serve(request, produce)

    async def _handle_other(self, request: web.Request) -> web.Response:
        status, body, content_type = await self._forward(request, await request.read())
        return web.Response(body=body, status=status, content_type=content_type)


# --------------------------------------------------------------------------- the command line


def _server(args: argparse.Namespace) -> tuple[Any, str]:
    if args.upstream:
        proxy = FaultProxy(
            args.upstream, host=args.host, port=args.port, request_log_size=args.request_log_size
        )
        return proxy, f"fault proxy in front of {args.upstream}"
    return with_faults(server_from_args(args)), f"dev server ({args.backend} backend) with fault injection"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.fault_injection``: the dev server's options, plus ``--upstream URL``."""
    parser = build_parser("python -m benchmarks.fault_injection")
    parser.add_argument(
        "--upstream",
        default=None,
        metavar="URL",
        help="serve a fault proxy in front of this SGLang server or router instead (the backend options "
        "are ignored)",
    )
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return asyncio.run(serve_until_stopped(*_server(args)))
    except KeyboardInterrupt:
        return 0
    except (FileNotFoundError, ValueError, OSError, ImportError) as exc:
        return usage_error(exc)


if __name__ == "__main__":
    sys.exit(main())
