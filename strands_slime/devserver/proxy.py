"""A fault proxy: the dev server's ``/dev/`` test hooks in front of any SGLang server or router.

Every request is forwarded to ``upstream`` unchanged (method, path, query, body, the content type and
routing headers); ``/generate`` additionally passes through :class:`TestHooks`, so the request log,
queued faults and the seeded fault mix that the soak uses work against a real SGLang server exactly as
against the dev server. A client that disconnects closes the forwarded request too, which SGLang treats
as an abort.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
from aiohttp import web

from strands_slime.devserver.hooks import TestHooks

logger = logging.getLogger(__name__)

FORWARDED_HEADERS = ("content-type", "accept", "x-smg-routing-key", "x-smg-target-worker", "authorization")
CLIENT_MAX_SIZE = 512 * 1024 * 1024


class FaultProxy:
    """``async with FaultProxy(upstream) as proxy``: serves on ``proxy.url``, forwards to ``upstream``.

    ``proxy.hooks`` (also ``inject_fault``, ``set_fault_mix``, ``request_log``) are the dev server's test
    hooks; ``record_replies`` keeps each ``/generate`` reply in the log as the server sent it.
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
        self.hooks = TestHooks(request_log_size, record_replies=record_replies)
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def request_log(self) -> list[dict[str, Any]]:
        """Every ``/generate`` request that came through, oldest first (see :class:`TestHooks`)."""
        return self.hooks.request_log

    def inject_fault(self, **fault: Any) -> None:
        """Fail or delay the next ``/generate`` requests (:meth:`TestHooks.inject_fault`)."""
        self.hooks.inject_fault(**fault)

    def set_fault_mix(self, faults: list[dict[str, Any]], seed: int = 0) -> None:
        """A seeded fault draw for every ``/generate`` request (:meth:`TestHooks.set_fault_mix`)."""
        self.hooks.set_fault_mix(faults, seed)

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
