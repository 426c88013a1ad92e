"""The in-process :class:`DevServer`: its lifecycle, options and HTTP routes.

Routes follow SGLang's native server (see docs/devserver.md); each delegates to the module that owns
its concept: request validation (``protocol``, ``validation``), scheduling and aborts
(``scheduler``), control bodies (``control``) and the ``/dev/`` test hooks SGLang does not have
(``hooks``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from strands_slime import __version__
from strands_slime.devserver.backends.base import Backend
from strands_slime.devserver.backends.factory import build_backend
from strands_slime.devserver.control import (
    CONTINUED,
    FLUSHED_TEXT,
    PAUSED,
    WEIGHT_UPDATES,
    AbortRequest,
    PauseGeneration,
    UpdateWeightVersion,
    parse_body,
)
from strands_slime.devserver.hooks import Handler, TestHooks, dumps, json_body, json_reply, refusing
from strands_slime.devserver.moved import moved
from strands_slime.devserver.protocol import (
    ContextLimits,
    ParsedGenerate,
    ProtocolError,
    SpeculativeDecoding,
    parse_generate,
)
from strands_slime.devserver.request import MoEShape
from strands_slime.devserver.scheduler import Scheduler
from strands_slime.devserver.validation import build_generation_request

if TYPE_CHECKING:
    from strands_slime.devserver.backends.scripted import Script

logger = logging.getLogger(__name__)

CLIENT_MAX_SIZE = 512 * 1024 * 1024
SGLANG_VERSION = "0.5.23"
"""The SGLang release whose protocol the dev server follows."""


class DevServer:
    """An SGLang-compatible server in this process: ``async with DevServer(...) as server``.

    ``backend`` is ``"scripted"`` (replies from ``script``), ``"hf"`` (``model``: a local directory,
    a loaded transformers model, or None for the tiny random Qwen3) or a :class:`Backend` instance.
    The options are the command line's (docs/devserver.md has the table).

    Raises:
        ValueError: an option out of range (before anything starts).
    """

    def __init__(
        self,
        backend: str | Backend = "scripted",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        script: Script | list[Any] | dict[str, Any] | str | Path | None = None,
        model: Any = None,
        tokenizer: Any = None,
        context_length: int | None = None,
        max_running_requests: int | None = None,
        max_total_tokens: int | None = None,
        weight_version: str = "default",
        latency: float = 0.0,
        token_latency: float = 0.0,
        seed: int | None = None,
        request_log_size: int = 10_000,
        speculative_algorithm: str | None = None,
        speculative_num_draft_tokens: int | None = None,
        routed_experts: tuple[int, int] | tuple[int, int, int] | None = None,
        constrained_json_disable_any_whitespace: bool = False,
    ) -> None:
        if isinstance(backend, str) and backend not in ("scripted", "hf"):
            raise ValueError(f"backend must be 'scripted', 'hf' or a Backend instance, got {backend!r}")
        for name, value in (("context_length", context_length), ("max_total_tokens", max_total_tokens)):
            if value is not None and value < 8:
                raise ValueError(f"{name} must be at least 8, got {value}")
        if latency < 0 or token_latency < 0:
            raise ValueError("latency and token_latency must be >= 0")
        self.moe = MoEShape.from_option(routed_experts)
        self.speculative = SpeculativeDecoding.from_options(
            speculative_algorithm, speculative_num_draft_tokens
        )
        self._backend_choice = backend
        self._backend_options = {"script": script, "model": model, "tokenizer": tokenizer}
        self.host = host
        self.port = port
        self._context_length_arg = context_length
        self._max_running_arg = max_running_requests
        self._max_total_tokens_arg = max_total_tokens
        self.weight_version = weight_version
        self.latency = latency
        self.token_latency = token_latency
        self.seed = seed
        self.json_any_whitespace = not constrained_json_disable_any_whitespace
        self.hooks = TestHooks(request_log_size)
        self._rng = random.Random(seed)
        self._runner: web.AppRunner | None = None
        self._ready = False
        self._started_at = 0.0
        self.backend: Backend | None = None
        self.scheduler: Scheduler | None = None
        self.limits: ContextLimits | None = None
        self.url = ""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> DevServer:
        """Load the backend (in a worker thread), bind the port and start serving.

        Raises:
            RuntimeError: already started.
            OSError: the port cannot be bound (the backend is released again).
        """
        if self._runner is not None:
            raise RuntimeError("this DevServer is already started")
        backend = self._backend_choice
        if not isinstance(backend, Backend):
            backend = await asyncio.to_thread(
                build_backend, backend, context_length=self._context_length_arg, **self._backend_options
            )
        await backend.start()
        self.backend = backend
        backend.json_any_whitespace = self.json_any_whitespace
        context_length = self._context_length_arg or backend.default_context_length
        self.limits = ContextLimits(
            context_length=context_length,
            max_total_tokens=self._max_total_tokens_arg or max(4 * context_length, 262_144),
            reserved_tokens=self.speculative.reserved_tokens if self.speculative else 0,
        )
        self.scheduler = Scheduler(
            backend,
            max_running_requests=self._max_running_arg or backend.default_max_running_requests,
            weight_version=lambda: self.weight_version,
            latency=self.latency,
            token_latency=self.token_latency,
        )
        runner = web.AppRunner(self._make_app(), handler_cancellation=True, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError:
            await runner.cleanup()
            await backend.close()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{self.port}"
        self._started_at = time.time()
        self._ready = True
        logger.info("dev server (%s backend) listening on %s", backend.name, self.url)
        return self

    async def stop(self) -> None:
        """Abort every request, close the port and release the backend."""
        self._ready = False
        if self.scheduler is not None:
            await self.scheduler.shutdown()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.backend is not None:
            await self.backend.close()
            self.backend.tokens.close()

    async def __aenter__(self) -> DevServer:
        """Start the server (:meth:`start`)."""
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        """Stop the server (:meth:`stop`)."""
        await self.stop()

    # ------------------------------------------------------------------ test hooks

    @property
    def request_log(self) -> list[dict[str, Any]]:
        """Every received ``/generate`` request, oldest first (see :class:`TestHooks`)."""
        return self.hooks.request_log

    def clear_request_log(self) -> None:
        """Forget the logged requests."""
        self.hooks.clear_request_log()

    def __getattr__(self, name: str) -> Any:
        """The deprecated ``inject_fault``, ``clear_faults`` and ``set_fault_mix`` (``benchmarks/``)."""
        if name in ("inject_fault", "clear_faults", "set_fault_mix"):
            return functools.partial(moved(f"DevServer.{name}", name), self)
        raise AttributeError(f"'DevServer' object has no attribute {name!r}")

    def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        """Abort like ``POST /abort_request``; returns how many requests matched."""
        assert self.scheduler is not None
        return self.scheduler.abort(rid, abort_all=abort_all)

    # ------------------------------------------------------------------ status

    def model_info(self) -> dict[str, Any]:
        """The ``/model_info`` body (SGLang's keys)."""
        assert self.backend is not None
        return {
            **self.backend.model_info(),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
        }

    def server_info(self) -> dict[str, Any]:
        """The ``/server_info`` body: SGLang's keys for the options the dev server has, plus ``devserver``."""
        assert self.backend is not None and self.scheduler is not None and self.limits is not None
        no_speculation = dict.fromkeys(("algorithm", "num_steps", "eagle_topk", "num_draft_tokens"))
        return {
            "model_path": self.backend.model_info().get("model_path"),
            "context_length": self._context_length_arg,
            "max_running_requests": self.scheduler.max_running_requests,
            "max_total_tokens": self._max_total_tokens_arg,
            "random_seed": self.seed,
            "weight_version": self.weight_version,
            "tp_size": 1,
            "dp_size": 1,
            "device": "cpu",
            **(
                self.speculative.server_args()
                if self.speculative
                else {f"speculative_{key}": None for key in no_speculation}
            ),
            "status": "ready" if self._ready else "starting",
            "max_total_num_tokens": self.limits.max_total_tokens,
            "max_req_input_len": self.limits.max_req_input_len,
            "version": SGLANG_VERSION,
            "devserver": {
                "package_version": __version__,
                "backend": self.backend.name,
                "eos_token_ids": sorted(self.backend.eos_token_ids),
                "prefix_cache": self.backend.cache_stats(),
            },
        }

    # ------------------------------------------------------------------ routes

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=CLIENT_MAX_SIZE)
        status = {
            "/model_info": self.model_info,
            "/server_info": self.server_info,
            "/v1/models": self._models,
            "/v1/loads": self._loads,
        }
        app.add_routes(
            [
                web.post("/generate", self._handle_generate),
                web.put("/generate", self._handle_generate),
                web.get("/health", self._handle_health),
                web.get("/health_generate", self._handle_health),
                *(web.get(path, self._status_handler(body)) for path, body in status.items()),
                web.get("/get_model_info", self._status_handler(self.model_info)),
                web.get("/get_server_info", self._status_handler(self.server_info)),
                web.post("/abort_request", refusing(self._handle_abort)),
                web.get("/flush_cache", self._handle_flush_cache),
                web.post("/flush_cache", self._handle_flush_cache),
                web.post("/update_weight_version", refusing(self._handle_update_weight_version)),
                *(
                    web.post(f"/update_weights_from_{source}", refusing(self._handle_update_weights))
                    for source in WEIGHT_UPDATES
                ),
                web.post("/pause_generation", refusing(self._handle_pause)),
                web.post("/continue_generation", self._handle_continue),
                *self.hooks.routes(),
            ]
        )
        return app

    @staticmethod
    def _status_handler(body: Callable[[], dict[str, Any]]) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            return json_reply(body())

        return handle

    def _models(self) -> dict[str, Any]:
        """``/v1/models``: one model whose ``max_model_len`` is the context length."""
        assert self.limits is not None
        name = str(self.model_info().get("model_path"))
        model = {"id": name, "object": "model", "created": int(self._started_at), "owned_by": "sglang"}
        return {
            "object": "list",
            "data": [{**model, "root": name, "max_model_len": self.limits.context_length}],
        }

    def _loads(self) -> dict[str, Any]:
        """``/v1/loads``: the request counts of SGLang's core section, which slime polls after an abort
        (what else SGLang reports there is left out)."""
        assert self.scheduler is not None
        load = {
            "dp_rank": 0,
            "num_running_reqs": self.scheduler.num_running,
            "num_waiting_reqs": self.scheduler.num_waiting,
        }
        return {"version": SGLANG_VERSION, "loads": [load]}

    async def _handle_generate(self, request: web.Request) -> web.StreamResponse:
        return await self.hooks.serve(request, self._generate_reply)

    async def _generate_reply(self, raw: bytes) -> tuple[int, bytes]:
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ProtocolError.pydantic(f"JSON decode error: {exc}") from None
        return 200, dumps(await self._generate(parse_generate(body))).encode()

    def _next_seed(self, parsed: ParsedGenerate) -> int:
        if parsed.params.sampling_seed is not None:
            return int(parsed.params.sampling_seed)
        return self._rng.getrandbits(63)

    async def _generate(self, parsed: ParsedGenerate) -> Any:
        """One reply body, or a list of ``n`` for ``n > 1``."""
        assert self.backend is not None and self.limits is not None and self.scheduler is not None
        base = await build_generation_request(
            parsed,
            backend=self.backend,
            limits=self.limits,
            seed=self._next_seed(parsed),
            moe=self.moe,
            speculative=self.speculative,
        )
        n = parsed.params.n
        if n <= 1:  # SGLang answers n < 1 like n = 1
            return await self.scheduler.submit(base)
        return await self.scheduler.submit_samples(base, n, lambda: self._next_seed(parsed))

    async def _handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._ready else 503)

    async def _handle_abort(self, request: web.Request) -> web.Response:
        assert self.scheduler is not None
        body = parse_body(AbortRequest, await json_body(request))
        self.scheduler.abort(body.rid, abort_all=body.abort_all)
        return web.Response(status=200)

    async def _handle_flush_cache(self, request: web.Request) -> web.Response:
        assert self.scheduler is not None and self.backend is not None
        if self.scheduler.live:  # SGLang's Scheduler.flush_cache refuses unless fully idle
            return web.Response(status=400, text="Flush cache failed.\n")
        self.backend.flush_cache()
        return web.Response(status=200, text=FLUSHED_TEXT)

    async def _handle_update_weight_version(self, request: web.Request) -> web.Response:
        assert self.scheduler is not None
        body = parse_body(UpdateWeightVersion, await json_body(request))
        if body.abort_all_requests:
            self.scheduler.abort(abort_all=True)
        self.weight_version = body.new_version
        message = f"Weight version updated to {body.new_version}"
        return json_reply({"success": True, "message": message, "new_version": body.new_version})

    async def _handle_update_weights(self, request: web.Request) -> web.Response:
        assert self.scheduler is not None
        model, message = WEIGHT_UPDATES[request.path.rsplit("_", 1)[-1]]
        update = parse_body(model, await json_body(request))
        if update.abort_all_requests:
            self.scheduler.abort(abort_all=True)
        if update.weight_version is not None:
            self.weight_version = update.weight_version
            message += f" Weight version updated to {update.weight_version}."
        return json_reply({"success": True, "message": message, "num_paused_requests": 0})

    async def _handle_pause(self, request: web.Request) -> web.Response:
        assert self.scheduler is not None
        parse_body(PauseGeneration, await json_body(request))
        self.scheduler.pause()
        await self.scheduler.wait_until_idle()  # SGLang replies once the aborted requests ended
        return json_reply(PAUSED)

    async def _handle_continue(self, request: web.Request) -> web.Response:
        assert self.scheduler is not None
        self.scheduler.resume()
        return json_reply(CONTINUED)
