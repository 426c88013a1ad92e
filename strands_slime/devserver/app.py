"""The aiohttp application and the in-process :class:`DevServer`.

Routes follow SGLang's native server (see docs/devserver.md); routes under ``/dev/`` are test hooks
that SGLang does not have: the request log and fault injection.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import json
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from strands_slime import __version__
from strands_slime.devserver.backends.base import Backend
from strands_slime.devserver.protocol import (
    ContextLimits,
    ParsedGenerate,
    PromptSpec,
    ProtocolError,
    SpeculativeDecoding,
    new_rid,
    parse_generate,
    speculative_server_args,
)
from strands_slime.devserver.request import GenerationRequest, MoEShape
from strands_slime.devserver.scheduler import Scheduler

if TYPE_CHECKING:
    from strands_slime.devserver.backends.scripted import Script

logger = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.23"
"""The SGLang release whose protocol the dev server emulates."""
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
"""``LoadSnapshot.VALID_SECTIONS``: what ``/v1/loads?include=`` accepts."""
REDACTED_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})
CLIENT_MAX_SIZE = 512 * 1024 * 1024
_FLUSHED_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


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


def _wants_top_p_replay(custom_params: Any) -> bool:
    """slime asks for the top-p nucleus of every sampled token with this custom param."""
    return isinstance(custom_params, dict) and bool(custom_params.get("return_top_p_token_ids"))


def _moe_shape(value: tuple[int, ...] | None) -> MoEShape | None:
    if value is None:
        return None
    if len(value) not in (2, 3) or any(int(v) < 1 for v in value):
        raise ValueError(
            f"routed_experts must be (num_layers, topk[, num_experts]) of positive ints, got {value}"
        )
    layers, topk = int(value[0]), int(value[1])
    experts = int(value[2]) if len(value) == 3 else max(8, topk)
    if topk > experts:
        raise ValueError(f"routed_experts: topk {topk} exceeds num_experts {experts}")
    return MoEShape(layers, topk, experts)


# --------------------------------------------------------------------------- faults


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
        assert self.status is not None
        default = (
            "The request queue is full." if self.status == 503 else f"Injected fault (HTTP {self.status})."
        )
        return ProtocolError.for_status(self.status, self.message or default)


class FaultMix:
    """A seeded draw per ``/generate`` request: fault ``i`` with probability ``weight_i``.

    A drawn fault with ``count`` > 1 is a burst: it also hits the next ``count - 1`` requests."""

    def __init__(self, faults: list[Any], seed: int = 0) -> None:
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
        point = self._rng.random()
        for weight, spec in self.choices:
            if point < weight:
                return Fault.from_obj(spec)
            point -= weight
        return None

    def describe(self) -> dict[str, Any]:
        return {"seed": self.seed, "faults": [{"weight": w, **spec} for w, spec in self.choices]}


@dataclass(slots=True)
class _LoggedRequest:
    headers: dict[str, str]
    raw: bytes = b""
    status: int | None = None
    evicted: bool = False
    received: float = field(default_factory=time.time)
    fault: str | None = None

    def as_dict(self) -> dict[str, Any]:
        try:
            body = json.loads(self.raw) if self.raw else None
        except ValueError:
            body = None
        entry = {"json": body, "headers": self.headers, "status": self.status, "time": self.received}
        if self.fault is not None:
            entry["fault"] = self.fault
        return entry


class RequestLog:
    """The last ``max_entries`` ``/generate`` requests, also capped by body bytes.

    Bodies are kept as raw bytes and decoded when read: a parsed 5k-token prompt costs ~36 bytes per
    token in Python objects, which long benchmarks cannot afford ten thousand times.
    """

    def __init__(self, max_entries: int, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: collections.deque[_LoggedRequest] = collections.deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, headers: dict[str, str]) -> _LoggedRequest:
        entry = _LoggedRequest(headers=headers)
        self._entries.append(entry)
        self._trim()
        return entry

    def set_body(self, entry: _LoggedRequest, raw: bytes) -> None:
        entry.raw = raw
        if not entry.evicted:
            self._bytes += len(raw)
            self._trim()

    def _trim(self) -> None:
        while len(self._entries) > self.max_entries or (
            self._bytes > self.max_bytes and len(self._entries) > 1
        ):
            oldest = self._entries.popleft()
            oldest.evicted = True
            self._bytes -= len(oldest.raw)

    def entries(self) -> list[dict[str, Any]]:
        return [entry.as_dict() for entry in self._entries]

    def clear(self) -> int:
        count = len(self._entries)
        for entry in self._entries:
            entry.evicted = True
        self._entries.clear()
        self._bytes = 0
        return count


class _DroppedConnection(Exception):
    """Raised inside a handler after the socket was closed on purpose."""


# --------------------------------------------------------------------------- server


HF_BACKEND_NEEDS_TORCH = "the hf backend needs torch: pip install 'strands-slime[devserver]'"


class DevServer:
    """An SGLang-compatible server in this process: ``async with DevServer(...) as server``.

    ``backend`` is ``"scripted"`` (replies from ``script``), ``"hf"`` (``model``: a local directory,
    a loaded transformers model, or None for the tiny random Qwen3) or a :class:`Backend` instance.
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
        max_queued_requests: int | None = None,
        max_total_tokens: int | None = None,
        weight_version: str = "default",
        latency: float = 0.0,
        token_latency: float = 0.0,
        seed: int | None = None,
        model_seed: int = 0,
        served_model_name: str | None = None,
        prefix_cache_tokens: int | None = None,
        return_original_logprob: bool | None = None,
        request_log_size: int = 10_000,
        speculative_algorithm: str | None = None,
        routed_experts: tuple[int, int] | tuple[int, int, int] | None = None,
        speculative_num_draft_tokens: int | None = None,
        constrained_json_disable_any_whitespace: bool = False,
    ) -> None:
        if isinstance(backend, str) and backend not in ("scripted", "hf"):
            raise ValueError(f"backend must be 'scripted', 'hf' or a Backend instance, got {backend!r}")
        if context_length is not None and context_length < 8:
            raise ValueError(f"context_length must be at least 8, got {context_length}")
        if max_total_tokens is not None and max_total_tokens < 8:
            raise ValueError(f"max_total_tokens must be at least 8, got {max_total_tokens}")
        if latency < 0 or token_latency < 0:
            raise ValueError("latency and token_latency must be >= 0")
        if request_log_size < 1:
            raise ValueError(f"request_log_size must be >= 1, got {request_log_size}")
        self.moe = _moe_shape(routed_experts)
        self.speculative = SpeculativeDecoding.from_options(
            speculative_algorithm, speculative_num_draft_tokens
        )
        if return_original_logprob is None:
            flag = os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "")
            return_original_logprob = flag.strip().lower() in ("1", "true", "yes", "on")
        self._backend_choice = backend
        self.host = host
        self.port = port
        self._script = script
        self._model = model
        self._tokenizer_path = tokenizer
        self._context_length_arg = context_length
        self._max_running_arg = max_running_requests
        self.max_queued_requests = max_queued_requests
        self._max_total_tokens_arg = max_total_tokens
        self.weight_version = weight_version
        self.latency = latency
        self.token_latency = token_latency
        self.seed = seed
        self.model_seed = model_seed
        self._served_model_name = served_model_name
        self._prefix_cache_tokens = prefix_cache_tokens
        self.return_original_logprob = return_original_logprob
        self.constrained_json_disable_any_whitespace = constrained_json_disable_any_whitespace
        self._log = RequestLog(request_log_size)
        self._faults: collections.deque[Fault] = collections.deque()
        self._fault_mix: FaultMix | None = None
        self._rng = random.Random(seed)
        self._runner: web.AppRunner | None = None
        self._ready = False
        self._started_at = 0.0
        self.backend: Backend | None = None
        self.scheduler: Scheduler | None = None
        self.limits: ContextLimits | None = None
        self.url = ""

    # ------------------------------------------------------------------ lifecycle

    def _build_backend(self) -> Backend:
        """Load the tokenizer and model (blocking; runs in a worker thread)."""
        if isinstance(self._backend_choice, Backend):
            return self._backend_choice
        from strands_slime.devserver.tokens import TokenizerWorker, load_devserver_tokenizer

        def load_tokenizer(path: Any) -> Any:
            if path is None or isinstance(path, (str, Path)):
                return load_devserver_tokenizer(None if path is None else str(path))
            return path  # an already loaded tokenizer object

        tokenizer_path = self._tokenizer_path
        if self._backend_choice == "hf":
            try:
                from strands_slime.devserver.backends.hf import HFBackend
            except ModuleNotFoundError as exc:
                if exc.name != "torch":
                    raise
                raise ModuleNotFoundError(HF_BACKEND_NEEDS_TORCH, name="torch") from exc

            if tokenizer_path is None and isinstance(self._model, (str, Path)):
                model_dir = Path(self._model)
                if (model_dir / "tokenizer.json").exists() or (model_dir / "tokenizer_config.json").exists():
                    tokenizer_path = str(model_dir)
            tokens = TokenizerWorker(load_tokenizer(tokenizer_path))
            model_obj = None if self._model is None or isinstance(self._model, (str, Path)) else self._model
            model_path = str(self._model) if isinstance(self._model, (str, Path)) else None
            return HFBackend(
                tokens,
                model=model_obj,
                model_path=model_path,
                seed=self.model_seed,
                context_length=self._context_length_arg,
                prefix_cache_tokens=self._prefix_cache_tokens,
                return_original_logprob=self.return_original_logprob,
            )
        from strands_slime.devserver.backends.scripted import (
            DEFAULT_PREFIX_CACHE_TOKENS,
            Script,
            ScriptedBackend,
        )

        if self._script is None:
            script = Script.default()
        elif isinstance(self._script, (str, Path)):
            script = Script.load(self._script)
        else:
            script = Script.from_obj(self._script)
        tokens = TokenizerWorker(load_tokenizer(tokenizer_path))
        return ScriptedBackend(
            script,
            tokens,
            context_length=self._context_length_arg,
            prefix_cache_tokens=self._prefix_cache_tokens or DEFAULT_PREFIX_CACHE_TOKENS,
        )

    async def start(self) -> DevServer:
        if self._runner is not None:
            raise RuntimeError("this DevServer is already started")
        backend = await asyncio.to_thread(self._build_backend)
        await backend.start()
        self.backend = backend
        backend.json_any_whitespace = not self.constrained_json_disable_any_whitespace
        context_length = self._context_length_arg or backend.default_context_length
        max_total = self._max_total_tokens_arg or max(4 * context_length, 262_144)
        self.limits = ContextLimits(
            context_length=context_length,
            max_total_tokens=max_total,
            reserved_tokens=self.speculative.reserved_tokens if self.speculative else 0,
        )
        self.scheduler = Scheduler(
            backend,
            max_running_requests=self._max_running_arg or backend.default_max_running_requests,
            max_queued_requests=self.max_queued_requests,
            weight_version=lambda: self.weight_version,
            latency=self.latency,
            token_latency=self.token_latency,
        )
        runner = web.AppRunner(self._make_app(), handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            await backend.close()
            raise
        self._runner = runner
        address = runner.addresses[0]
        self.port = int(address[1])
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{self.port}"
        self._started_at = time.time()
        self._ready = True
        logger.info("dev server (%s backend) listening on %s", backend.name, self.url)
        return self

    async def stop(self) -> None:
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
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ test hooks

    @property
    def request_log(self) -> list[dict[str, Any]]:
        """Every received ``/generate`` request, oldest first: ``{"json", "headers", "status"}``."""
        return self._log.entries()

    def clear_request_log(self) -> None:
        self._log.clear()

    def inject_fault(
        self,
        *,
        status: int | None = None,
        count: int = 1,
        drop_connection: bool = False,
        delay_s: float = 0.0,
        message: str | None = None,
        cut_body: str | None = None,
    ) -> None:
        """Make the next ``count`` ``/generate`` requests fail (status, dropped, cut body) or wait ``delay_s``."""
        spec: dict[str, Any] = {"count": count, "drop_connection": drop_connection, "delay_s": delay_s}
        if status is not None:
            spec["status"] = status
        if cut_body is not None:
            spec["cut_body"] = cut_body
        if message is not None:
            spec["message"] = message
        self._faults.append(Fault.from_obj(spec))

    def clear_faults(self) -> None:
        self._faults.clear()
        self._fault_mix = None

    def set_fault_mix(self, faults: list[dict[str, Any]], seed: int = 0) -> None:
        """From now on every ``/generate`` request draws a fault from ``faults`` (each with a ``weight``)."""
        self._fault_mix = FaultMix(faults, seed)

    def _take_fault(self) -> Fault | None:
        if not self._faults and self._fault_mix is not None:
            drawn = self._fault_mix.draw()
            if drawn is not None:
                self._faults.append(drawn)
        if not self._faults:
            return None
        fault = self._faults[0]
        fault.count -= 1
        if fault.count <= 0:
            self._faults.popleft()
        return fault

    def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        assert self.scheduler is not None
        return self.scheduler.abort(rid, abort_all=abort_all)

    # ------------------------------------------------------------------ app

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=CLIENT_MAX_SIZE)
        routes = [
            web.post("/generate", self._handle_generate),
            web.put("/generate", self._handle_generate),
            web.get("/health", self._handle_health),
            web.get("/health_generate", self._handle_health),
            web.get("/model_info", self._handle_model_info),
            web.get("/get_model_info", self._handle_model_info),
            web.get("/server_info", self._handle_server_info),
            web.get("/get_server_info", self._handle_server_info),
            web.get("/v1/models", self._handle_models),
            web.get("/v1/loads", self._handle_loads),
            web.post("/abort_request", self._handle_abort),
            web.get("/flush_cache", self._handle_flush_cache),
            web.post("/flush_cache", self._handle_flush_cache),
            web.post("/update_weight_version", self._handle_update_weight_version),
            web.post("/update_weights_from_disk", self._handle_update_weights),
            web.post("/update_weights_from_tensor", self._handle_update_weights),
            web.post("/update_weights_from_distributed", self._handle_update_weights),
            web.post("/pause_generation", self._handle_pause),
            web.post("/continue_generation", self._handle_continue),
            web.get("/dev/requests", self._handle_dev_requests),
            web.delete("/dev/requests", self._handle_dev_requests_clear),
            web.get("/dev/faults", self._handle_dev_faults),
            web.post("/dev/faults", self._handle_dev_faults_add),
            web.delete("/dev/faults", self._handle_dev_faults_clear),
            web.post("/dev/fault_mix", self._handle_dev_fault_mix),
        ]
        app.add_routes(routes)
        return app

    @property
    def served_model_name(self) -> str:
        assert self.backend is not None
        return self._served_model_name or str(self.backend.model_info().get("model_path"))

    @staticmethod
    def _headers(request: web.Request) -> dict[str, str]:
        return {
            name: ("<redacted>" if name.lower() in REDACTED_HEADERS else value)
            for name, value in request.headers.items()
        }

    @staticmethod
    async def _json_body(request: web.Request) -> Any:
        raw = await request.read()
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ProtocolError.pydantic(f"JSON decode error: {exc}") from None

    @staticmethod
    def _error(exc: ProtocolError) -> web.Response:
        return web.json_response(exc.body, status=exc.status, dumps=_dumps)

    # ------------------------------------------------------------------ /generate

    async def _handle_generate(self, request: web.Request) -> web.StreamResponse:
        entry = self._log.add(self._headers(request))
        try:
            raw = await request.read()
            self._log.set_body(entry, raw)
            body: Any = None
            decode_error: ProtocolError | None = None
            try:
                body = json.loads(raw)
            except ValueError as exc:
                decode_error = ProtocolError.pydantic(f"JSON decode error: {exc}")
            fault = self._take_fault()
            if fault is not None:
                entry.fault = fault.label()
                await self._apply_fault(request, fault)
            if decode_error is not None:
                raise decode_error
            parsed = parse_generate(body)
            if parsed.stream:
                entry.status = 200
                return await self._stream(request, parsed)
            result = await self._run(parsed)
            entry.status = 200
            if fault is not None and fault.cut_body is not None:
                return await self._cut_reply(request, _dumps(result).encode(), fault.cut_body)
            return web.json_response(result, dumps=_dumps)
        except ProtocolError as exc:
            entry.status = exc.status
            return self._error(exc)
        except _DroppedConnection:
            raise asyncio.CancelledError from None

    async def _apply_fault(self, request: web.Request, fault: Fault) -> None:
        if fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault.drop_connection:
            transport = request.transport
            if transport is not None:
                transport.abort()
            raise _DroppedConnection
        if fault.status is not None:
            raise fault.error()

    @staticmethod
    async def _cut_reply(request: web.Request, body: bytes, how: str) -> web.StreamResponse:
        half = body[: len(body) // 2]
        if how == "truncate":
            return web.Response(body=half, content_type="application/json")
        reply = web.StreamResponse(headers={"Content-Type": "application/json"})
        reply.content_length = len(body)
        await reply.prepare(request)
        await reply.write(half)
        if request.transport is not None:
            request.transport.abort()
        raise _DroppedConnection

    def _sampling_seed(self, spec: PromptSpec) -> int:
        if spec.params.sampling_seed is not None:
            return int(spec.params.sampling_seed)
        return self._rng.getrandbits(63)

    async def _build_request(self, parsed: ParsedGenerate, spec: PromptSpec) -> GenerationRequest:
        """Tokenize and run SGLang's E3 checks for one prompt, then let the backend accept it."""
        backend, limits = self.backend, self.limits
        assert backend is not None and limits is not None
        if spec.input_ids is not None:
            ids = spec.input_ids
        else:
            assert spec.text is not None
            ids = await backend.tokens.encode(spec.text, add_special_tokens=True)
            if not ids:
                raise ProtocolError.value("input_ids cannot be empty.")
        vocab = backend.vocab_size
        low, high = min(ids), max(ids)
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise ProtocolError.value(f"Token id {bad} in the input is outside the vocabulary [0, {vocab}).")
        params = spec.params
        # SGLang's TokenizerManager._validate_one_request order: lengths, token_ids_logprob, hidden
        # states, custom logit processor; then SamplingParams.verify; then the scheduler's checks.
        limits.check_tokenizer_stage(len(ids), params)
        for token in spec.token_ids_logprob or ():
            if not 0 <= token < vocab:
                raise ProtocolError.value(
                    f"token_ids_logprob contains out-of-vocabulary token id {token}; valid range is [0, {vocab})."
                )
        if parsed.return_hidden_states:
            raise ProtocolError.value(
                "The server is not configured to return hidden states. Please set "
                "`--return-hidden-states-mode last`, `--return-hidden-states-mode full`, or the legacy "
                "`--enable-return-hidden-states` flag."
            )
        if parsed.custom_logit_processor:
            raise ProtocolError.value(
                "The server is not configured to enable custom logit processor. "
                "Please set `--enable-custom-logit-processor` to enable this feature."
            )
        params.verify(vocab)
        limits.check_scheduler_stage(len(ids))
        if spec.return_logprob and spec.logprob_start_len > len(ids):
            raise ProtocolError.value(
                f"req.logprob_start_len={spec.logprob_start_len} is higher than the number of input tokens "
                f"len(req.origin_input_ids)={len(ids)}. Please use a smaller logprob_start_len."
            )
        if parsed.return_routed_experts and not 0 <= parsed.routed_experts_start_len <= len(ids):
            raise ProtocolError.value(
                f"routed_experts_start_len={parsed.routed_experts_start_len} must be in [0, {len(ids)}] "
                "(the number of input tokens)."
            )
        stop_ids = (
            frozenset() if params.ignore_eos else backend.eos_token_ids | frozenset(params.stop_token_ids)
        )
        generation = GenerationRequest(
            rid=spec.rid or new_rid(),
            input_ids=list(ids),
            params=params,
            max_new_tokens=limits.clip_max_new_tokens(len(ids), params.max_new_tokens),
            stop_token_ids=stop_ids,
            return_logprob=spec.return_logprob,
            logprob_start_len=spec.logprob_start_len,
            top_logprobs_num=spec.top_logprobs_num,
            token_ids_logprob=spec.token_ids_logprob,
            return_text_in_logprobs=parsed.return_text_in_logprobs,
            return_prompt_token_ids=parsed.return_prompt_token_ids,
            seed=self._sampling_seed(spec),
            return_top_p_token_ids=_wants_top_p_replay(params.custom_params),
            routed_experts=self.moe if parsed.return_routed_experts else None,
            routed_experts_start_len=parsed.routed_experts_start_len,
            speculative=self.speculative,
        )
        await backend.prepare(generation)
        return generation

    def _sample_copy(self, base: GenerationRequest, *, warmup: bool = False) -> GenerationRequest:
        """A fresh request for ``n > 1``: a new uuid rid (so aborting the caller's rid misses it)."""
        return GenerationRequest(
            rid=new_rid(),
            input_ids=base.input_ids,
            params=base.params,
            max_new_tokens=0 if warmup else base.max_new_tokens,
            stop_token_ids=base.stop_token_ids,
            return_logprob=False if warmup else base.return_logprob,
            logprob_start_len=-1 if warmup else base.logprob_start_len,
            top_logprobs_num=0 if warmup else base.top_logprobs_num,
            token_ids_logprob=None if warmup else base.token_ids_logprob,
            return_text_in_logprobs=base.return_text_in_logprobs,
            return_prompt_token_ids=base.return_prompt_token_ids,
            seed=base.seed if base.params.sampling_seed is not None else self._rng.getrandbits(63),
            received_at=base.received_at,
            backend_state=base.backend_state,
            return_top_p_token_ids=base.return_top_p_token_ids,
            routed_experts=None if warmup else base.routed_experts,
            routed_experts_start_len=base.routed_experts_start_len,
            speculative=base.speculative,
            grammar=base.grammar,
        )

    async def _prepare_all(self, parsed: ParsedGenerate) -> list[GenerationRequest]:
        """Every request this body turns into; for ``n > 1`` the hidden warm-up runs first."""
        assert self.scheduler is not None
        bases = [await self._build_request(parsed, spec) for spec in parsed.prompts]
        if parsed.n == 1:
            return bases
        await self._submit_all([self._sample_copy(base, warmup=True) for base in bases])
        return [self._sample_copy(base) for base in bases for _ in range(parsed.n)]

    async def _submit_all(self, requests: list[GenerationRequest]) -> list[dict[str, Any]]:
        assert self.scheduler is not None
        if len(requests) == 1:
            return [await self.scheduler.submit(requests[0])]
        tasks = [asyncio.ensure_future(self.scheduler.submit(req)) for req in requests]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()  # cancelling a submit aborts its request
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _run(self, parsed: ParsedGenerate) -> Any:
        requests = await self._prepare_all(parsed)
        results = await self._submit_all(requests)
        return results if parsed.returns_list else results[0]

    # ------------------------------------------------------------------ streaming

    async def _stream(self, request: web.Request, parsed: ParsedGenerate) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)

        async def send(obj: Any) -> None:
            await response.write(f"data: {_dumps(obj)}\n\n".encode())

        try:
            requests = await self._prepare_all(parsed)
        except ProtocolError as exc:
            await send(self._stream_error(exc))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        queue: asyncio.Queue[tuple[int, dict[str, Any]] | None] = asyncio.Queue()
        tagged = parsed.returns_list
        pumps = [asyncio.ensure_future(self._pump(index, req, queue)) for index, req in enumerate(requests)]

        async def close_queue() -> None:
            await asyncio.gather(*pumps, return_exceptions=True)
            queue.put_nowait(None)

        closer = asyncio.ensure_future(close_queue())
        try:
            while (item := await queue.get()) is not None:
                index, chunk = item
                if tagged:
                    chunk = {**chunk, "index": index}
                await send(chunk)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        finally:
            for pump in pumps:
                pump.cancel()
            closer.cancel()
            await asyncio.gather(*pumps, closer, return_exceptions=True)
        return response

    @staticmethod
    def _stream_error(exc: ProtocolError) -> dict[str, Any]:
        return {
            "error": {
                "message": exc.message,
                "type": "invalid_request_error" if exc.status == 400 else str(exc.status),
                "code": exc.status,
                "retryable": exc.status >= 500,
            }
        }

    async def _pump(
        self, index: int, request: GenerationRequest, queue: asyncio.Queue[tuple[int, dict[str, Any]] | None]
    ) -> None:
        """Forward one request's cumulative chunks (every ``stream_interval`` tokens) to the queue."""
        assert self.scheduler is not None
        request.progress = asyncio.Event()
        interval = max(1, request.params.stream_interval or 1)
        submitted = asyncio.ensure_future(self.scheduler.submit(request))
        emitted = 0
        try:
            while not submitted.done():
                woken = asyncio.ensure_future(request.progress.wait())
                await asyncio.wait({submitted, woken}, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                request.progress.clear()
                if submitted.done() or request.status != "running":
                    continue
                if len(request.output_ids) - emitted >= interval:
                    emitted = len(request.output_ids)
                    chunk = await self.scheduler.renderer.render(
                        request, final=False, weight_version=self.weight_version
                    )
                    queue.put_nowait((index, chunk))
            try:
                queue.put_nowait((index, submitted.result()))
            except ProtocolError as exc:
                queue.put_nowait((index, self._stream_error(exc)))
        finally:
            if not submitted.done():
                submitted.cancel()  # the client went away: abort the request

    # ------------------------------------------------------------------ other endpoints

    async def _handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._ready else 503)

    def model_info(self) -> dict[str, Any]:
        assert self.backend is not None
        info = self.backend.model_info()
        return {
            "model_path": info.get("model_path"),
            "served_model_name": self.served_model_name,
            "tokenizer_path": info.get("tokenizer_path"),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": info.get("model_type"),
            "architectures": info.get("architectures"),
        }

    async def _handle_model_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.model_info(), dumps=_dumps)

    def server_info(self) -> dict[str, Any]:
        assert self.backend is not None and self.scheduler is not None and self.limits is not None
        info = self.backend.model_info()
        return {
            "model_path": info.get("model_path"),
            "tokenizer_path": info.get("tokenizer_path"),
            "served_model_name": self.served_model_name,
            "host": self.host,
            "port": self.port,
            "context_length": self._context_length_arg,
            "max_running_requests": self.scheduler.max_running_requests,
            "max_queued_requests": self.max_queued_requests,
            "max_total_tokens": self._max_total_tokens_arg,
            "random_seed": self.seed,
            "weight_version": self.weight_version,
            "skip_tokenizer_init": False,
            "allow_auto_truncate": False,
            "disable_radix_cache": False,
            "preferred_sampling_params": None,
            "tp_size": 1,
            "dp_size": 1,
            "page_size": 1,
            "device": "cpu",
            **speculative_server_args(self.speculative),
            "status": "ready" if self._ready else "starting",
            "max_total_num_tokens": self.limits.max_total_tokens,
            "max_req_input_len": self.limits.max_req_input_len,
            "internal_states": [
                {
                    "last_gen_throughput": self.scheduler.gen_throughput(),
                    "prefix_cache": self.backend.cache_stats(),
                }
            ],
            "version": SGLANG_VERSION,
            "devserver": {
                "package_version": __version__,
                "backend": self.backend.name,
                "latency": self.latency,
                "token_latency": self.token_latency,
                "return_original_logprob": self.return_original_logprob,
                "eos_token_ids": sorted(self.backend.eos_token_ids),
            },
        }

    async def _handle_server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.server_info(), dumps=_dumps)

    async def _handle_models(self, request: web.Request) -> web.Response:
        assert self.limits is not None
        name = self.served_model_name
        body = {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(self._started_at),
                    "owned_by": "sglang",
                    "root": name,
                    "parent": None,
                    "max_model_len": self.limits.context_length,
                }
            ],
        }
        return web.json_response(body, dumps=_dumps)

    async def _handle_loads(self, request: web.Request) -> web.Response:
        """SGLang 0.5.23's ``/v1/loads`` (``srt/entrypoints/v1_loads.py``): one DP rank, core keys of
        ``LoadSnapshot``; the optional sections (memory, spec, lora, disagg, queues) are never present."""
        assert self.scheduler is not None and self.limits is not None and self.backend is not None
        include = request.query.get("include")
        if include:
            sections = {part.strip() for part in include.split(",")}
            invalid = sections - LOAD_SECTIONS
            if invalid:
                return self._error(
                    ProtocolError.http(
                        f"Invalid include sections: {invalid}. Valid options: {sorted(LOAD_SECTIONS)}", 400
                    )
                )
        scheduler = self.scheduler
        used = scheduler.used_tokens()
        waiting = scheduler.waiting_tokens()
        capacity = self.limits.max_total_tokens
        load = {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": scheduler.num_running,
            "num_waiting_reqs": scheduler.num_waiting,
            "num_waiting_uncached_tokens": waiting,
            "num_used_tokens": used,
            "num_total_tokens": used + waiting,
            "num_active_tokens": used + waiting,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": capacity,
            "max_running_requests": scheduler.max_running_requests,
            "token_usage": used / capacity if capacity else 0.0,
            "gen_throughput": scheduler.gen_throughput(),
            "cache_hit_rate": self.backend.cache_stats().get("cache_hit_rate", 0.0),
            "utilization": scheduler.num_running / scheduler.max_running_requests,
            "total_prefill_uncached_tokens": 0,
            "total_prefill_busy_us": 0,
            "decode_moments": None,
        }
        body = {
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "version": SGLANG_VERSION,
            "accelerator": None,
            "num_accelerators": 1,
            "loads": [load],
        }
        return web.json_response(body, dumps=_dumps)

    async def _handle_abort(self, request: web.Request) -> web.Response:
        try:
            body = await self._json_body(request)
            if not isinstance(body, dict):
                raise ProtocolError.pydantic("Input should be a valid dictionary")
            rid, abort_all = body.get("rid"), body.get("abort_all", False)
            if rid is not None and not isinstance(rid, str):
                raise ProtocolError.pydantic(f"rid: Input should be a valid string, got {rid!r}")
            if not isinstance(abort_all, bool):
                raise ProtocolError.pydantic(f"abort_all: Input should be a valid boolean, got {abort_all!r}")
        except ProtocolError as exc:
            return self._error(exc)
        assert self.scheduler is not None
        self.scheduler.abort(rid, abort_all=abort_all)
        return web.Response(status=200)

    async def _handle_flush_cache(self, request: web.Request) -> web.Response:
        assert self.scheduler is not None and self.backend is not None
        if self.scheduler.live:  # SGLang's Scheduler.flush_cache refuses unless fully idle
            return web.Response(status=400, text="Flush cache failed.\n")
        self.backend.flush_cache()
        return web.Response(status=200, text=_FLUSHED_TEXT)

    async def _handle_update_weight_version(self, request: web.Request) -> web.Response:
        try:
            body = await self._json_body(request)
            version = body.get("new_version") if isinstance(body, dict) else None
            abort_all = body.get("abort_all_requests", True) if isinstance(body, dict) else True
            if not isinstance(version, str) or not version:
                raise ProtocolError.pydantic("new_version: Field required (a non-empty string)")
            if not isinstance(abort_all, bool):
                raise ProtocolError.pydantic("abort_all_requests: Input should be a valid boolean")
        except ProtocolError as exc:
            return self._error(exc)
        assert self.scheduler is not None
        if abort_all:
            self.scheduler.abort(abort_all=True)
        self.weight_version = version
        body = {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        return web.json_response(body, dumps=_dumps)

    async def _handle_update_weights(self, request: web.Request) -> web.Response:
        """``/update_weights_from_{disk,tensor,distributed}``: the weights stay, the version moves.

        As in SGLang: ``abort_all_requests`` (default false) aborts in-flight requests first;
        ``weight_version``, when given, becomes the version later replies carry."""
        source = request.path.rsplit("_", 1)[-1]
        try:
            body = await self._json_body(request)
            if not isinstance(body, dict):
                raise ProtocolError.pydantic("Input should be a valid dictionary")
            missing = [name for name in _WEIGHT_UPDATE_REQUIRED[source] if name not in body]
            if missing:
                raise ProtocolError.pydantic(f"{missing[0]}: Field required")
            abort_all = body.get("abort_all_requests", False)
            version = body.get("weight_version")
            if not isinstance(abort_all, bool):
                raise ProtocolError.pydantic("abort_all_requests: Input should be a valid boolean")
            if version is not None and not isinstance(version, str):
                raise ProtocolError.pydantic("weight_version: Input should be a valid string")
        except ProtocolError as exc:
            return self._error(exc)
        assert self.scheduler is not None
        if abort_all:
            self.scheduler.abort(abort_all=True)
        message = _WEIGHT_UPDATE_MESSAGES[source]
        if version is not None:
            self.weight_version = version
            message += f" Weight version updated to {version}."
        reply: dict[str, Any] = {"success": True, "message": message}
        if source == "disk":
            reply["num_paused_requests"] = 0
        return web.json_response(reply, dumps=_dumps)

    async def _handle_pause(self, request: web.Request) -> web.Response:
        assert self.scheduler is not None
        try:
            body = await self._json_body(request)
            mode = body.get("mode", "abort") if isinstance(body, dict) else "abort"
            if mode not in ("abort", "retract", "in_place"):  # PauseGenerationReqInput.mode's Literal
                raise ProtocolError.pydantic(
                    f"mode: Input should be 'abort', 'retract' or 'in_place', got {mode!r}"
                )
        except ProtocolError as exc:
            return self._error(exc)
        self.scheduler.pause(mode)
        if mode == "abort":  # TokenizerManager.pause_generation returns once the aborted requests ended
            await self.scheduler.wait_until_idle()
        body = {"message": "Generation paused successfully.", "status": "ok"}
        return web.json_response(body, dumps=_dumps)

    async def _handle_continue(self, request: web.Request) -> web.Response:
        assert self.scheduler is not None
        self.scheduler.resume()
        body = {"message": "Generation continued successfully.", "status": "ok"}
        return web.json_response(body, dumps=_dumps)

    # ------------------------------------------------------------------ /dev hooks

    async def _handle_dev_requests(self, request: web.Request) -> web.Response:
        return web.json_response(self.request_log, dumps=_dumps)

    async def _handle_dev_requests_clear(self, request: web.Request) -> web.Response:
        return web.json_response({"cleared": self._log.clear()}, dumps=_dumps)

    async def _handle_dev_faults(self, request: web.Request) -> web.Response:
        return web.json_response([fault.describe() for fault in self._faults], dumps=_dumps)

    async def _handle_dev_faults_add(self, request: web.Request) -> web.Response:
        try:
            body = await self._json_body(request)
            faults = (
                [Fault.from_obj(item) for item in body] if isinstance(body, list) else [Fault.from_obj(body)]
            )
        except ProtocolError as exc:
            return self._error(exc)
        except ValueError as exc:
            return self._error(ProtocolError.value(f"bad fault: {exc}"))
        self._faults.extend(faults)
        return web.json_response({"pending": [fault.describe() for fault in self._faults]}, dumps=_dumps)

    async def _handle_dev_faults_clear(self, request: web.Request) -> web.Response:
        self.clear_faults()
        return web.json_response({"pending": []}, dumps=_dumps)

    async def _handle_dev_fault_mix(self, request: web.Request) -> web.Response:
        try:
            body = await self._json_body(request)
            if not isinstance(body, dict):
                raise ValueError('send {"faults": [...], "seed": N}')
            seed = body.get("seed", 0)
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise ValueError(f"seed must be an integer, got {seed!r}")
            self.set_fault_mix(body.get("faults"), seed)
        except ProtocolError as exc:
            return self._error(exc)
        except ValueError as exc:
            return self._error(ProtocolError.value(f"bad fault mix: {exc}"))
        assert self._fault_mix is not None
        return web.json_response(self._fault_mix.describe(), dumps=_dumps)
