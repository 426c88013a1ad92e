"""Async HTTP client for SGLang's native ``/generate`` API.

Built for RL rollouts: hundreds of episodes share one client on one event loop, the connection pool
queues instead of failing, transient faults are retried with exponential backoff and jitter, and
deterministic errors (a prompt over the context length, a bad parameter) are raised at once as typed
exceptions instead of being retried for minutes.

Deadlines (see docs/provider.md, "Timeouts and aborts"): ``timeout`` bounds one request on the wire
(never the wait for a pooled connection); ``first_byte_timeout`` bounds the silence before the reply
starts (a non-streaming ``/generate`` says nothing until the generation is finished, so it must exceed
the longest generation); ``stall_timeout`` bounds a gap between bytes once the reply has started. An
``abort_check`` ends every wait of a request within ~``ABORT_POLL_S`` and no request is sent after it.
"""

from __future__ import annotations

import array
import asyncio
import contextvars
import itertools
import json
import logging
import math
import operator
import random
import sys
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

if sys.version_info >= (3, 11):
    from asyncio import timeout_at
else:  # pragma: no cover - aiohttp depends on async-timeout below 3.11
    from async_timeout import timeout_at

try:  # SGLang itself depends on orjson, so slime's image has it; the stdlib is the fallback.
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None  # type: ignore[assignment]

from strands_slime.aborts import ABORT_BATCH, ABORT_POLL_S, run_abortable
from strands_slime.provider.client_errors import (
    BODY_EXCERPT_CHARS,
    RETRYABLE_STATUSES,
    SGLangAbortedError,
    SGLangBadRequestError,
    SGLangClientError,
    SGLangConnectionError,
    SGLangContextLengthError,
    SGLangDecodingError,
    SGLangHTTPError,
    SGLangThrottledError,
    SGLangTimeoutError,
    classify_http_error,
)
from strands_slime.provider.request_check import InvalidRequestError, checked_payload, checked_token_ids

__all__ = [  # the errors live in client_errors; importing them from here keeps working
    "ABORT_BATCH",
    "ABORT_POLL_S",
    "DEFAULT_FIRST_BYTE_TIMEOUT_S",
    "DEFAULT_STALL_TIMEOUT_S",
    "RETRYABLE_STATUSES",
    "ROUTING_KEY_HEADER",
    "FinishReason",
    "GenerateResponse",
    "InvalidRequestError",
    "RetryEvent",
    "SGLangAbortedError",
    "SGLangBadRequestError",
    "SGLangClient",
    "SGLangClientError",
    "SGLangConnectionError",
    "SGLangContextLengthError",
    "SGLangDecodingError",
    "SGLangHTTPError",
    "SGLangThrottledError",
    "SGLangTimeoutError",
    "classify_http_error",
    "retry_logger",
    "run_abortable",
]

logger = logging.getLogger(__name__)
retry_logger = logging.getLogger(__name__ + ".retries")
"""One DEBUG record per retry of a request and one when its retries end, each carrying a
:class:`RetryEvent` as ``record.retry_event``: a rollout's progress display turns them into a live line
about an unhealthy server (DEBUG, so a training log does not get a line per retry)."""

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
_METADATA_MAX_RETRIES = 3
_CONTEXT_RESERVING_SPECULATIVE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "FROZEN_KV_MTP"})
"""SGLang's ``SpeculativeAlgorithm.is_eagle()`` family: their draft tokens take context slots."""
DEFAULT_FIRST_BYTE_TIMEOUT_S = 3600.0
"""32,768 new tokens at 10 tok/s (a request's decode speed on a KV-bound engine under load) plus queueing."""
DEFAULT_STALL_TIMEOUT_S = 60.0
"""SGLang writes a non-streaming reply in one go: a minute without bytes mid-reply is a dead connection."""


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """What happened to one request that needed a retry (see :data:`retry_logger`).

    ``outcome`` is ``retrying`` (attempt ``attempt`` of at most ``max_attempts`` failed with ``error``;
    the next one starts in ``delay_s``), then once: ``recovered`` (an attempt succeeded), ``gave_up``
    (the retries ran out, or an error that is not retried came) or ``ended`` (aborted or cancelled)."""

    request: int
    outcome: Literal["retrying", "recovered", "gave_up", "ended"]
    attempt: int
    max_attempts: int
    error: str
    delay_s: float | None = None


_retried_requests = itertools.count(1)


def _report_retry(
    request: int,
    outcome: Literal["retrying", "recovered", "gave_up", "ended"],
    attempt: int,
    max_attempts: int,
    error: SGLangClientError | None,
    delay_s: float | None,
) -> None:
    """Log one :class:`RetryEvent` on :data:`retry_logger` (nothing is formatted unless someone listens)."""
    if not retry_logger.isEnabledFor(logging.DEBUG):
        return
    event = RetryEvent(request, outcome, attempt, max_attempts, str(error) if error else "", delay_s)
    if outcome == "retrying":
        retry_logger.debug(
            "attempt %d of %d failed, retrying in %.1f s: %s",
            attempt,
            max_attempts,
            delay_s,
            event.error,
            extra={"retry_event": event},
        )
    else:
        retry_logger.debug(
            "request %s after %d attempts", outcome.replace("_", " "), attempt, extra={"retry_event": event}
        )


@dataclass(slots=True)
class FinishReason:
    """``meta_info.finish_reason``: ``stop`` (``matched`` id or string), ``length`` or ``abort``."""

    type: str
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None
    status_code: int | None = None
    raw: dict[str, Any] | None = None

    @classmethod
    def parse(cls, value: Any) -> FinishReason | None:
        """``meta_info.finish_reason`` as SGLang sends it (a string or a mapping); None when absent.

        Raises:
            SGLangDecodingError: it is neither a string nor a mapping.
        """
        if value is None:
            return None
        if isinstance(value, str):
            return cls(type=value)
        if not isinstance(value, Mapping):
            raise SGLangDecodingError(f"finish_reason has an unexpected shape: {value!r}")
        return cls(
            type=str(value.get("type")),
            matched=value.get("matched"),
            length=value.get("length"),
            message=value.get("message"),
            status_code=value.get("status_code"),
            raw=dict(value),
        )


@dataclass(slots=True)
class GenerateResponse:
    """A parsed ``/generate`` reply. Aborted generations are results too (see :attr:`is_abort`).

    ``meta_info`` is the server's, less ``output_token_logprobs`` and ``input_token_logprobs``: their
    ids and logprobs are ``output_ids``, ``output_logprobs`` and ``input_logprobs``."""

    text: str
    output_ids: list[int]
    output_logprobs: list[float | None]
    finish_reason: FinishReason | None
    meta_info: dict[str, Any]
    input_logprobs: list[float | None] = field(default_factory=list)

    @property
    def rid(self) -> str | None:
        """The request id SGLang gave this generation (``meta_info.id``)."""
        return self.meta_info.get("id")

    @property
    def is_abort(self) -> bool:
        """True when the server aborted the generation (the output so far is still returned)."""
        return self.finish_reason is not None and self.finish_reason.type == "abort"

    @property
    def prompt_tokens(self) -> int | None:
        """None for a request aborted while queued (SGLang omits the key)."""
        return self.meta_info.get("prompt_tokens")

    @property
    def completion_tokens(self) -> int:
        """Tokens generated (``meta_info.completion_tokens``, else the number of output ids)."""
        return int(self.meta_info.get("completion_tokens", len(self.output_ids)) or 0)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache (0 when not reported)."""
        return int(self.meta_info.get("cached_tokens") or 0)

    @property
    def e2e_latency(self) -> float | None:
        """Seconds from arrival to the last token as the server measured them, if reported."""
        value = self.meta_info.get("e2e_latency")
        return float(value) if value is not None else None

    @property
    def weight_version(self) -> str | None:
        """The weight version that generated this output (slime's weight updates), if reported."""
        return self.meta_info.get("weight_version")

    @classmethod
    def parse(cls, body: Any) -> GenerateResponse:
        """Parse defensively: only ``output_ids`` or the logprob entries are required."""
        if not isinstance(body, Mapping):
            raise SGLangDecodingError(f"expected a JSON object from /generate, got {type(body).__name__}")
        meta = body.get("meta_info")
        if not isinstance(meta, Mapping):
            raise SGLangDecodingError("the /generate reply has no meta_info object")
        meta = dict(meta)
        # The per-token entries ([logprob, id, text] lists, one per token) are parsed into the fields
        # below and not kept: hundreds of small lists per reply would otherwise stay alive with the
        # response for the garbage collector to walk.
        entries = meta.pop("output_token_logprobs", None) or []
        input_entries = meta.pop("input_token_logprobs", None) or []
        output_ids = body.get("output_ids")
        try:
            if output_ids is None:
                output_ids = [int(entry[1]) for entry in entries]
            logprobs = _logprobs(entries)
            input_logprobs = _logprobs(input_entries)
            if entries and len(entries) != len(output_ids):
                raise SGLangDecodingError(
                    f"/generate returned {len(output_ids)} output_ids but {len(entries)} output logprobs"
                )
            if entries and not _ids_match(entries, output_ids):
                raise SGLangDecodingError("/generate output_ids disagree with the token ids of its logprobs")
        except (TypeError, IndexError, ValueError) as exc:
            raise SGLangDecodingError(f"malformed logprob entries in /generate reply: {exc}") from exc
        return cls(
            text=body.get("text") or "",
            output_ids=list(output_ids),
            output_logprobs=logprobs,
            finish_reason=FinishReason.parse(meta.get("finish_reason")),
            meta_info=meta,
            input_logprobs=input_logprobs,
        )


_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
_NUMBER_OR_NULL = frozenset((float, type(None)))


def _logprobs(entries: list[Any]) -> list[float | None]:
    """The logprob of each ``[logprob, id, text]`` entry, a float or None. JSON gives floats: taken as
    they are, in C (a reply holds one entry per token); anything else is converted one by one."""
    try:
        values = list(map(_FIRST, entries))
    except (TypeError, KeyError):
        values = None  # not lists: the loop below says what is wrong
    if values is not None and _NUMBER_OR_NULL.issuperset(map(type, values)):
        return values
    return [None if (value := entry[0]) is None else float(value) for entry in entries]


def _ids_match(entries: list[Any], output_ids: list[Any]) -> bool:
    """Whether each logprob entry's token id equals the output id at its position."""
    try:  # one list comparison in C: the common, well-formed case
        if list(map(_SECOND, entries)) == output_ids:
            return True
    except (TypeError, IndexError, KeyError):
        pass
    # Element by element, stopping at the first mismatch (malformed entries raise as they always did).
    return not any(int(entry[1]) != tok for entry, tok in zip(entries, output_ids, strict=True))


def _finite(deadline: float) -> float | None:
    return None if math.isinf(deadline) else deadline


def _expired(deadline: Any) -> bool:
    """``asyncio.Timeout.expired()`` is a method, async-timeout's ``expired`` a property."""
    value = deadline.expired
    return bool(value() if callable(value) else value)


def _reschedule(deadline: Any, when: float | None) -> None:
    """``asyncio.Timeout.reschedule``; async-timeout (Python 3.10) spells it ``update``/``reject``."""
    if hasattr(deadline, "reschedule"):
        deadline.reschedule(when)
    elif when is None:
        deadline.reject()
    else:
        deadline.update(when)


def _encode_json(value: Any) -> bytes:
    """Compact JSON exactly as ``json.dumps`` writes it (ASCII-escaped, NaN kept)."""
    return json.dumps(value, separators=(",", ":")).encode()


def _encode_token_ids(token_ids: Any) -> bytes:
    """Token ids (a list, or an ``array`` as a trajectory holds them) as JSON: orjson is ~15x faster on
    long int lists than the stdlib encoder, and encodes an array through a numpy view of its buffer
    without making a Python int of each id."""
    if type(token_ids).__module__ == "numpy":  # an int64 array from request_check
        if orjson is not None:
            return orjson.dumps(token_ids, option=orjson.OPT_SERIALIZE_NUMPY)
        token_ids = token_ids.tolist()
    if isinstance(token_ids, array.array):
        if orjson is not None:
            import numpy  # a dependency of the package; imported on first use only

            view = numpy.frombuffer(token_ids, dtype=numpy.dtype(token_ids.typecode))
            return orjson.dumps(view, option=orjson.OPT_SERIALIZE_NUMPY)
        token_ids = token_ids.tolist()
    if orjson is not None:
        try:
            return orjson.dumps(token_ids)
        except TypeError:  # not plain ints (numpy scalars, > 64 bits): the stdlib decides
            pass
    return _encode_json(token_ids)


def _parse_generate(reply: Any) -> GenerateResponse:
    if isinstance(reply, list):
        raise SGLangDecodingError("/generate returned a batch for a single prompt (n > 1?)")
    return GenerateResponse.parse(reply)


def _decode_json(raw: bytes) -> Any:
    """Parse a reply with orjson when available; what it rejects (NaN literals, ...) goes to the stdlib,
    so the accepted documents and the errors are the stdlib's."""
    if orjson is not None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)


class _Pool:
    """A loop's connection slots (a semaphore, so the wait for one is outside every request deadline)
    and how many requests wait for one."""

    def __init__(self, size: int) -> None:
        self._slots = asyncio.Semaphore(size)
        self.waiting = 0

    async def __aenter__(self) -> None:
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1

    async def __aexit__(self, *exc_info: object) -> None:
        self._slots.release()


@dataclass
class _LoopState:
    """Everything bound to one event loop: the aiohttp session, the pool slots (a semaphore, so the wait
    for a connection is outside every request deadline) and single-flight metadata calls."""

    session: aiohttp.ClientSession
    guard: AsyncIterator[None]
    slots: _Pool
    inflight: dict[str, asyncio.Future[Any]] = field(default_factory=dict)


_SEND_GUARD: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "strands_slime_send_guard", default=None
)
"""The abort flag of the request the current task is sending (set around one attempt)."""


class _GuardedConnector(aiohttp.TCPConnector):
    """A connector that hands out no connection once the requesting rollout was aborted.

    The attempt loop checks the flag before each attempt, but opening a connection takes a few loop
    iterations, and an abort cancels a large rollout's requests over several (:data:`ABORT_BATCH`
    per iteration): the flag is read again here, once the connection is ready. ``ClientSession``
    writes the request as soon as ``connect`` (the connectors' documented coroutine) returns, with no
    await in between (``tests/test_client.py`` pins it), so an aborted request is never written."""

    async def connect(self, req: aiohttp.ClientRequest, *args: Any, **kwargs: Any) -> Any:
        """A connection for ``req``, unless the current attempt's abort flag is set.

        Raises:
            SGLangAbortedError: the rollout was aborted; the unused connection went back to the pool.
        """
        connection = await super().connect(req, *args, **kwargs)
        check = _SEND_GUARD.get()
        if check is not None and check():
            connection.release()
            raise SGLangAbortedError(f"{req.method} {req.url} was not sent: the rollout was aborted")
        return connection


async def _close_at_loop_shutdown(session: aiohttp.ClientSession) -> AsyncIterator[None]:
    """Parked async generator: ``loop.shutdown_asyncgens()`` (run by ``asyncio.run``) closes it,
    which closes the session on its own loop, so no 'Unclosed client session' warning is left."""
    try:
        yield
    finally:
        if not session.closed:
            await session.close()


class SGLangClient:
    """Client for one SGLang server or router.

    A full connection pool makes requests wait for a free connection (it never fails them, and the
    wait counts against no deadline), and the client may be used from several event loops in turn
    (one aiohttp session per loop).
    """

    def __init__(
        self,
        base_url: str,
        max_connections: int = 1000,
        timeout: float | None = None,
        max_retries: int = 60,
        retry_delay: float = 1.0,
        *,
        connect_timeout: float | None = 10.0,
        first_byte_timeout: float | None = DEFAULT_FIRST_BYTE_TIMEOUT_S,
        stall_timeout: float | None = DEFAULT_STALL_TIMEOUT_S,
        max_retry_delay: float = 30.0,
        metadata_ttl_on_error: float = 2.0,
        headers: Mapping[str, str] | None = None,
        decode_scope: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        for name, value in (
            ("timeout", timeout),
            ("connect_timeout", connect_timeout),
            ("first_byte_timeout", first_byte_timeout),
            ("stall_timeout", stall_timeout),
        ):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds or None, got {value}")
        self.base_url = base_url.rstrip("/")
        if "://" not in self.base_url:
            self.base_url = "http://" + self.base_url
        self.max_connections = max_connections
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_delay = retry_delay
        self.connect_timeout = connect_timeout
        self.first_byte_timeout = first_byte_timeout
        self.stall_timeout = stall_timeout
        self.max_retry_delay = max_retry_delay
        self.metadata_ttl_on_error = metadata_ttl_on_error
        self.headers = dict(headers or {})
        self.decode_scope = decode_scope
        """Entered around decoding and parsing each reply (the rollout defers garbage collection there:
        ``rollout.gc_policy``)."""
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )
        self._cache: dict[str, Any] = {}
        self._errors: dict[str, tuple[float, BaseException]] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"SGLangClient({self.base_url!r}, max_connections={self.max_connections})"

    @classmethod
    def from_slime_args(cls, args: Any, **overrides: Any) -> SGLangClient:
        """Target slime's router with slime's pool size (concurrency per engine x engines)."""
        ip = getattr(args, "sglang_router_ip", None)
        port = getattr(args, "sglang_router_port", None)
        if not ip or not port:
            raise ValueError("args.sglang_router_ip and args.sglang_router_port must be set")
        concurrency = int(getattr(args, "sglang_server_concurrency", None) or 512)
        gpus = int(getattr(args, "rollout_num_gpus", None) or 1)
        per_engine = int(getattr(args, "rollout_num_gpus_per_engine", None) or 1)
        overrides.setdefault("max_connections", max(1, concurrency * gpus // max(1, per_engine)))
        return cls(f"http://{ip}:{port}", **overrides)

    # ------------------------------------------------------------------ sessions

    async def _state(self) -> _LoopState:
        if self._closed:
            raise SGLangClientError("this SGLangClient is closed")
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is not None and not state.session.closed:
            return state
        await self._forget_dead_loops()
        # The pool size is enforced by ``slots``; the connector never makes a request wait (its own
        # wait would count against aiohttp's deadlines). Request deadlines are ours (see _exchange).
        connector = _GuardedConnector(limit=0, limit_per_host=0, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=self.connect_timeout, sock_read=None
        )
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            headers=self.headers,
            auto_decompress=True,
        )
        guard = _close_at_loop_shutdown(session)
        await guard.__anext__()
        state = _LoopState(session=session, guard=guard, slots=_Pool(self.max_connections))
        self._loops[loop] = state
        return state

    async def _forget_dead_loops(self) -> None:
        """Close the sessions of closed loops. aiohttp's public ``close`` only marks such a session
        closed (its connections died with their loop) and never waits, whatever loop awaits it."""
        for loop, state in list(self._loops.items()):
            if loop.is_closed():
                del self._loops[loop]
                await state.session.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (a closed client raises on every request)."""
        return self._closed

    def waiting_for_connection(self) -> int:
        """Requests of the running loop waiting for a pooled connection now (the pool is full)."""
        state = self._loops.get(asyncio.get_running_loop())
        return state.slots.waiting if state is not None else 0

    async def close(self) -> None:
        """Close the sessions of this loop (and of any loop already closed)."""
        loop = asyncio.get_running_loop()
        state = self._loops.pop(loop, None)
        if state is not None:
            await state.guard.aclose()  # type: ignore[attr-defined]
        await self._forget_dead_loops()
        for other_loop, other in list(self._loops.items()):
            if other_loop.is_running():
                asyncio.run_coroutine_threadsafe(other.session.close(), other_loop)
        self._loops.clear()
        self._closed = True

    async def __aenter__(self) -> SGLangClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ requests

    def _backoff(self, attempt: int) -> float:
        delay = min(self.max_retry_delay, self.retry_delay * (2**attempt))
        return delay / 2 + random.uniform(0, delay / 2)

    async def request(
        self,
        method: str,
        path: str,
        *,
        payload: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        max_retries: int | None = None,
        expect_json: bool = True,
        abort_check: Callable[[], bool] | None = None,
        parse: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Send one request with the retry policy; return the decoded JSON body (None when empty), or
        what ``parse`` makes of it (its errors are raised as they are, never retried).

        ``body`` is an already encoded JSON payload (then ``payload`` must be None). Once
        ``abort_check()`` is true, no attempt is sent any more and any wait (pool, backoff, reply)
        ends with :class:`SGLangAbortedError` within ~``ABORT_POLL_S``."""
        if payload is not None and body is not None:
            raise ValueError("pass payload= or body=, not both")
        url = self.base_url + path
        if payload is not None:
            body = _encode_json(payload)
        send_headers = {"Content-Type": "application/json"} if body is not None else {}
        if headers:
            send_headers.update(headers)
        retries = self.max_retries if max_retries is None else max_retries
        attempts = self._attempts(method, url, body, send_headers, retries, expect_json, abort_check, parse)
        return await run_abortable(attempts, abort_check, f"{method} {url}", SGLangAbortedError)

    async def _attempts(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        retries: int,
        expect_json: bool,
        abort_check: Callable[[], bool] | None,
        parse: Callable[[Any], Any] | None = None,
    ) -> Any:
        retried: int | None = None  # the request's number in the retry events, from its first retry
        outcome: Literal["recovered", "gave_up", "ended"] = "ended"
        last_error: SGLangClientError | None = None
        attempt = 0
        delay = 0.0
        try:
            for attempt in range(retries + 1):
                if attempt:
                    await asyncio.sleep(delay)
                state = await self._state()
                async with state.slots:  # a full pool queues here, outside every deadline
                    if abort_check is not None and abort_check():  # never send after an abort
                        raise SGLangAbortedError(
                            f"{method} {url} was not sent (attempt {attempt + 1}): the rollout was aborted"
                        )
                    try:
                        guard = _SEND_GUARD.set(abort_check)
                        try:
                            status, raw = await self._exchange(state.session, method, url, body, headers)
                        finally:
                            _SEND_GUARD.reset(guard)
                    except SGLangTimeoutError as exc:
                        last_error = exc
                    except (
                        aiohttp.ClientConnectionError,
                        aiohttp.ClientPayloadError,
                        asyncio.TimeoutError,
                    ) as exc:
                        last_error = SGLangConnectionError(f"{method} {url}: {type(exc).__name__}: {exc}")
                    else:
                        if status == 200:
                            if not expect_json or not raw.strip():
                                outcome = "recovered"
                                return None
                            with self.decode_scope():
                                try:
                                    decoded = _decode_json(raw)
                                except ValueError as exc:
                                    excerpt = raw[:BODY_EXCERPT_CHARS].decode(errors="replace")
                                    last_error = SGLangDecodingError(
                                        f"invalid JSON from {url} ({exc}): {excerpt!r}"
                                    )
                                else:
                                    outcome = "gave_up"  # what parse raises is raised as it is
                                    parsed = decoded if parse is None else parse(decoded)
                                    del decoded  # its per-token lists go before collections resume
                                    outcome = "recovered"
                                    return parsed
                        else:
                            last_error = classify_http_error(
                                status, raw.decode(errors="replace"), url=url, attempts=attempt + 1
                            )
                assert last_error is not None
                if not last_error.retryable:
                    outcome = "gave_up"
                    raise last_error
                if attempt < retries:
                    delay = self._backoff(attempt)
                    if retried is None:
                        retried = next(_retried_requests)
                    _report_retry(retried, "retrying", attempt + 1, retries + 1, last_error, delay)
            assert last_error is not None
            outcome = "gave_up"
            if isinstance(last_error, SGLangHTTPError):
                last_error.attempts = retries + 1
            if retries and not isinstance(last_error, SGLangHTTPError):
                last_error.args = (f"{last_error} (gave up after {retries + 1} attempts)",)
            raise last_error
        finally:
            if retried is not None:
                _report_retry(retried, outcome, attempt + 1, retries + 1, last_error, None)

    async def _exchange(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
    ) -> tuple[int, bytes]:
        """One attempt on the wire, under our deadlines: ``timeout`` from now to the last byte,
        ``first_byte_timeout`` until the reply starts, ``stall_timeout`` between bytes after that."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        total_end = now + self.timeout if self.timeout is not None else math.inf
        stall = self.stall_timeout
        binding = "first_byte"  # which deadline the timer is set to: it names the error

        def arm(phase: str, phase_end: float) -> float | None:
            nonlocal binding
            binding = "total" if total_end <= phase_end else phase
            return _finite(min(total_end, phase_end))

        first_byte_end = now + self.first_byte_timeout if self.first_byte_timeout is not None else math.inf
        deadline = timeout_at(arm("first_byte", first_byte_end))
        try:
            async with deadline:
                async with session.request(method, url, data=body, headers=headers) as resp:
                    _reschedule(
                        deadline, arm("stall", loop.time() + stall if stall is not None else math.inf)
                    )
                    chunks: list[bytes] = []
                    async for chunk in resp.content.iter_any():
                        chunks.append(chunk)
                        if stall is not None:
                            _reschedule(deadline, arm("stall", loop.time() + stall))
                    return resp.status, b"".join(chunks)
        except asyncio.TimeoutError:  # the builtin TimeoutError only from 3.11 on
            if not _expired(deadline):
                raise  # aiohttp's own (connect) timeout
            where = f"{method} {url}: TimeoutError:"
            if binding == "total":
                message = f"{where} no complete reply within timeout_s={self.timeout:g}"
                raise SGLangTimeoutError(message, retryable=True) from None
            if binding == "first_byte":
                message = (
                    f"{where} the server sent nothing for first_byte_timeout_s={self.first_byte_timeout:g} "
                    "(hung server, or a generation longer than that)"
                )
                raise SGLangTimeoutError(message, retryable=False) from None
            message = f"{where} the reply stalled, no bytes for stall_timeout_s={self.stall_timeout:g}"
            raise SGLangTimeoutError(message, retryable=True) from None

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any] | None = None,
        *,
        return_logprob: bool = True,
        logprob_start_len: int | None = None,
        rid: str | None = None,
        routing_key: str | None = None,
        abort_check: Callable[[], bool] | None = None,
        vocab_size: int | None = None,
        check_ids: slice | None = None,
        **extra: Any,
    ) -> GenerateResponse:
        """Generate from token ids (a list, an ``array`` or a numpy array). ``logprob_start_len`` is
        omitted by default so the server returns output logprobs only and keeps its prefix cache (see
        the protocol notes). ``abort_check``: see :meth:`request`.

        Before anything is sent, ``input_ids[check_ids]`` (default: all of them) must be integers in
        ``[0, vocab_size)`` (``>= 0`` without a ``vocab_size``): SGLang does not check them, and one
        outside the embedding table crashes its scheduler. Numbers of another type (numpy scalars,
        integral floats) are converted to the JSON type SGLang accepts (:mod:`.request_check`).

        Raises:
            InvalidRequestError: a bad id or a value of the wrong type; nothing was sent.
        """
        input_ids = checked_token_ids(input_ids, vocab_size, check_ids)
        if not len(input_ids):
            raise InvalidRequestError("input_ids cannot be empty")
        payload: dict[str, Any] = {
            "sampling_params": dict(sampling_params or {}),
            "return_logprob": return_logprob,
        }
        if logprob_start_len is not None:
            payload["logprob_start_len"] = logprob_start_len
        if rid is not None:
            payload["rid"] = rid
        payload.update(extra)
        payload = checked_payload(payload)
        headers = {ROUTING_KEY_HEADER: routing_key} if routing_key else None
        # {"input_ids": [...], <the rest>}: the long id list gets the fast encoder.
        body = b'{"input_ids":' + _encode_token_ids(input_ids) + b"," + _encode_json(payload)[1:]
        # Encoded: drop the id list before awaiting. A young list of thousands of ids would be scanned by
        # every garbage-collector pass while hundreds of requests are in flight.
        del payload, input_ids
        return await self.request(
            "POST", "/generate", body=body, headers=headers, abort_check=abort_check, parse=_parse_generate
        )

    @property
    def metadata_retries(self) -> int:
        """Retries for metadata and control requests (``/model_info``, ``/abort_request``, ...).

        At most 3, so a flaky server cannot stall start-up for the minutes a generation may retry, and
        never more than ``max_retries``: ``max_retries=0`` means one attempt everywhere."""
        return min(self.max_retries, _METADATA_MAX_RETRIES)

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Abort the live request whose rid is exactly ``rid``, or all of them with ``abort_all``.

        SGLang (0.5.23) ignores a rid that is not live, so a batch's or ``n > 1`` requests cannot be
        aborted by the caller's rid; an exact match also aborts live requests whose rid starts with it.
        """
        payload: dict[str, Any] = {"rid": rid or "", "abort_all": abort_all}
        await self.request(
            "POST", "/abort_request", payload=payload, max_retries=self.metadata_retries, expect_json=False
        )

    async def health(self) -> bool:
        """True when ``GET /health`` answers 200 now (never cached: health is a live signal)."""
        try:
            await self.request("GET", "/health", max_retries=0, expect_json=False)
        except SGLangClientError:
            return False
        return True

    async def _cached(self, key: str, path: str) -> Any:
        """Fetch ``path`` once: success is cached for the client's life, a failure for a few seconds."""
        if key in self._cache:
            return self._cache[key]
        failed = self._errors.get(key)
        if failed is not None and time.monotonic() - failed[0] < self.metadata_ttl_on_error:
            raise failed[1]
        state = await self._state()
        pending = state.inflight.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self.request("GET", path, max_retries=self.metadata_retries))
            state.inflight[key] = pending
            pending.add_done_callback(lambda _f: state.inflight.pop(key, None))
        try:
            value = await asyncio.shield(pending)
        except SGLangClientError as exc:
            self._errors[key] = (time.monotonic(), exc)
            raise
        self._cache[key] = value
        self._errors.pop(key, None)
        return value

    async def model_info(self) -> dict[str, Any]:
        """``GET /model_info`` (cached)."""
        info = await self._cached("model_info", "/model_info")
        if not isinstance(info, Mapping):
            raise SGLangDecodingError(f"/model_info returned {type(info).__name__}, not an object")
        return dict(info)

    async def server_info(self) -> dict[str, Any]:
        """``GET /server_info`` (cached)."""
        info = await self._cached("server_info", "/server_info")
        if not isinstance(info, Mapping):
            raise SGLangDecodingError(f"/server_info returned {type(info).__name__}, not an object")
        return dict(info)

    async def max_model_len(self) -> int:
        """The served context length, from ``/v1/models`` ``data[0].max_model_len`` (cached)."""
        models = await self._cached("v1_models", "/v1/models")
        try:
            value = int(models["data"][0]["max_model_len"])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            self._cache.pop("v1_models", None)
            raise SGLangDecodingError(f"/v1/models has no data[0].max_model_len: {models!r:.300}") from exc
        if value <= 0:
            raise SGLangDecodingError(f"/v1/models reported max_model_len={value}")
        return value

    async def reserved_context_tokens(self) -> int:
        """Tokens SGLang adds to every prompt's length before its context checks (cached).

        Under EAGLE-family speculative decoding (EAGLE, EAGLE3, NEXTN/MTP) the draft tokens occupy
        output slots: SGLang 0.5.23's ``compute_num_reserved_tokens`` reserves ``max(eagle_topk *
        num_steps, num_draft_tokens)``, read here from ``/server_info``. 0 without speculative decoding.
        """
        info = await self.server_info()
        algorithm = info.get("speculative_algorithm")
        if (
            not isinstance(algorithm, str)
            or algorithm.upper() not in _CONTEXT_RESERVING_SPECULATIVE_ALGORITHMS
        ):
            return 0
        try:
            topk, steps, drafts = (
                int(info.get(key) or 0)
                for key in ("speculative_eagle_topk", "speculative_num_steps", "speculative_num_draft_tokens")
            )
        except (TypeError, ValueError) as exc:
            raise SGLangDecodingError(f"/server_info has malformed speculative settings: {exc}") from exc
        return max(topk * steps, drafts, 0)

    async def usable_context_length(self) -> int:
        """The context a request may fill: ``max_model_len`` less ``reserved_context_tokens`` (taken as
        0, with a debug log, when ``/server_info`` cannot be read, e.g. behind a router without it)."""
        context = await self.max_model_len()
        try:
            reserved = await self.reserved_context_tokens()
        except SGLangClientError as exc:
            logger.debug("speculative-decoding settings unavailable (no context reserved): %s", exc)
            return context  # asked again next time
        self._cache["usable_context_length"] = context - reserved
        return context - reserved

    def known_context_length(self) -> int | None:
        """What :meth:`usable_context_length` returned once both its reads succeeded (None before): read
        at every model call without a task or a loop round trip."""
        return self._cache.get("usable_context_length")
