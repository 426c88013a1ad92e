"""SGLangClient fault tests against a local misbehaving server (real HTTP over loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from threaded_app import serve_app_in_thread
from waiting import wait_until

from strands_slime.provider.client import (
    GenerateResponse,
    RetryEvent,
    SGLangAbortedError,
    SGLangBadRequestError,
    SGLangClient,
    SGLangConnectionError,
    SGLangContextLengthError,
    SGLangDecodingError,
    SGLangHTTPError,
    SGLangThrottledError,
    SGLangTimeoutError,
    retry_logger,
)

pytestmark = pytest.mark.unit

OK_BODY = {
    "text": "hi",
    "output_ids": [6023, 151645],
    "meta_info": {
        "id": "r1",
        "finish_reason": {"type": "stop", "matched": 151645},
        "prompt_tokens": 3,
        "weight_version": "default",
        "output_token_logprobs": [[-0.5, 6023, None], [-0.1, 151645, None]],
        "completion_tokens": 2,
        "cached_tokens": 1,
        "e2e_latency": 0.01,
    },
}

Behaviour = Callable[[web.Request], Any]


class FaultServer:
    """Serves /generate from a queue of behaviours; the default behaviour is a good reply."""

    def __init__(self) -> None:
        self.behaviours: list[Behaviour] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.delay = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self.server_info: dict[str, Any] | None = None
        self.url = ""
        self.released = asyncio.Event()  # set at teardown: cuts every pending delay short

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        self.headers.append(dict(request.headers))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                with contextlib.suppress(asyncio.TimeoutError):  # the builtin one only from 3.11 on
                    await asyncio.wait_for(self.released.wait(), self.delay)
            if self.behaviours:
                return await self.behaviours.pop(0)(request)
            return web.json_response(OK_BODY)
        finally:
            self.in_flight -= 1

    async def handle_models(self, request: web.Request) -> web.StreamResponse:
        if self.behaviours:
            return await self.behaviours.pop(0)(request)
        return web.json_response({"object": "list", "data": [{"id": "m", "max_model_len": 4096}]})

    async def handle_health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def handle_server_info(self, request: web.Request) -> web.StreamResponse:
        if self.server_info is None:  # e.g. a router that does not forward it
            return web.Response(status=404, text="Not Found")
        return web.json_response(self.server_info)


def status(code: int, body: Any) -> Behaviour:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=code)

    return respond


async def drop_connection(request: web.Request) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.close()
    return web.Response(status=200)


async def truncated_json(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200, body=json.dumps(OK_BODY)[:40], content_type="application/json")


@pytest.fixture
async def fault_server() -> AsyncIterator[FaultServer]:
    server = FaultServer()
    app = web.Application()
    app.router.add_post("/generate", server.handle_generate)
    app.router.add_get("/v1/models", server.handle_models)
    app.router.add_get("/health", server.handle_health)
    app.router.add_get("/server_info", server.handle_server_info)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.url = f"http://127.0.0.1:{port}"
    yield server
    server.released.set()
    await runner.cleanup()


def make_client(url: str, **kwargs: Any) -> SGLangClient:
    kwargs.setdefault("retry_delay", 0.001)
    kwargs.setdefault("max_retry_delay", 0.01)
    return SGLangClient(url, **kwargs)


async def test_good_reply_is_parsed(fault_server: FaultServer) -> None:
    async with make_client(fault_server.url) as client:
        result = await client.generate([1, 2, 3], {"max_new_tokens": 8}, routing_key="session-1")
    assert isinstance(result, GenerateResponse)
    assert result.output_ids == [6023, 151645]
    assert result.output_logprobs == [-0.5, -0.1]
    assert result.finish_reason is not None and result.finish_reason.matched == 151645
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (3, 2, 1)
    sent = fault_server.requests[0]
    assert sent["input_ids"] == [1, 2, 3] and sent["return_logprob"] is True
    assert "logprob_start_len" not in sent, "input logprobs must not be requested by default"
    assert fault_server.headers[0]["X-SMG-Routing-Key"] == "session-1"


async def test_503_burst_then_success(fault_server: FaultServer) -> None:
    fault_server.behaviours = [status(503, {"object": "error", "message": "queue full", "code": 503})] * 5
    async with make_client(fault_server.url) as client:
        result = await client.generate([1], {})
    assert result.output_ids == [6023, 151645]
    assert len(fault_server.requests) == 6


@pytest.mark.parametrize("code", [408, 429, 500, 502])
async def test_transient_statuses_are_retried(fault_server: FaultServer, code: int) -> None:
    fault_server.behaviours = [status(code, {"error": "transient"})] * 2
    async with make_client(fault_server.url) as client:
        await client.generate([1], {})
    assert len(fault_server.requests) == 3


async def test_dropped_connections_are_retried(fault_server: FaultServer) -> None:
    fault_server.behaviours = [drop_connection, drop_connection]
    async with make_client(fault_server.url) as client:
        result = await client.generate([1], {})
    assert result.completion_tokens == 2
    assert len(fault_server.requests) == 3


async def test_truncated_json_is_retried(fault_server: FaultServer) -> None:
    fault_server.behaviours = [truncated_json]
    async with make_client(fault_server.url) as client:
        await client.generate([1], {})
    assert len(fault_server.requests) == 2


async def test_truncated_json_forever_raises_decoding_error(fault_server: FaultServer) -> None:
    fault_server.behaviours = [truncated_json] * 10
    async with make_client(fault_server.url, max_retries=3) as client:
        with pytest.raises(SGLangDecodingError, match="invalid JSON"):
            await client.generate([1], {})
    assert len(fault_server.requests) == 4


async def test_context_length_400_raised_at_once(fault_server: FaultServer) -> None:
    message = (
        "Requested token count exceeds the model's maximum context length of 4096 tokens. "
        "You requested a total of 5000 tokens"
    )
    fault_server.behaviours = [status(400, {"error": {"message": message}})] * 10
    async with make_client(fault_server.url) as client:
        with pytest.raises(SGLangContextLengthError) as info:
            await client.generate([1], {"max_new_tokens": 5000})
    assert len(fault_server.requests) == 1
    assert info.value.status == 400 and "4096" in str(info.value)


@pytest.mark.parametrize("code", [400, 401, 403, 404])
async def test_deterministic_errors_are_not_retried(fault_server: FaultServer, code: int) -> None:
    body = {"error": "unknown field `foo`, expected one of `max_new_tokens`"}
    fault_server.behaviours = [status(code, body)] * 10
    async with make_client(fault_server.url) as client:
        with pytest.raises(SGLangBadRequestError) as info:
            await client.generate([1], {"foo": 1})
    assert len(fault_server.requests) == 1
    assert info.value.status == code and "unknown field" in str(info.value)
    assert not isinstance(info.value, SGLangContextLengthError)


async def test_retries_exhausted_raise_typed_error(fault_server: FaultServer) -> None:
    fault_server.behaviours = [status(503, {"message": "busy"})] * 10
    async with make_client(fault_server.url, max_retries=2) as client:
        with pytest.raises(SGLangThrottledError) as info:
            await client.generate([1], {})
    assert info.value.attempts == 3 and "503" in str(info.value)


class _RetryEvents(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[RetryEvent] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(record.retry_event)  # type: ignore[attr-defined]


@contextlib.contextmanager
def _retry_events() -> Any:
    handler = _RetryEvents()
    level = retry_logger.level
    retry_logger.setLevel(logging.DEBUG)
    retry_logger.addHandler(handler)
    try:
        yield handler.events
    finally:
        retry_logger.removeHandler(handler)
        retry_logger.setLevel(level)


async def test_each_retry_and_how_the_retries_ended_are_reported(fault_server: FaultServer) -> None:
    """What a progress display needs for a live line about an unhealthy server (and nothing when the
    first attempt succeeds)."""
    async with make_client(fault_server.url, max_retries=3) as client:
        with _retry_events() as events:
            await client.generate([1], {})
            assert events == []
            fault_server.behaviours = [status(500, {"message": "engine on fire"})] * 2
            await client.generate([1], {})
            fault_server.behaviours = [status(503, {"message": "busy"})] * 10
            with pytest.raises(SGLangThrottledError):
                await client.generate([1], {})
            fault_server.behaviours = [status(500, {"message": "x"}), status(404, {"message": "gone"})]
            with pytest.raises(SGLangBadRequestError):
                await client.generate([1], {})
    steps = [(e.outcome, e.attempt, e.max_attempts) for e in events]
    assert steps == [
        ("retrying", 1, 4),
        ("retrying", 2, 4),
        ("recovered", 3, 4),
        ("retrying", 1, 4),
        ("retrying", 2, 4),
        ("retrying", 3, 4),
        ("gave_up", 4, 4),
        ("retrying", 1, 4),
        ("gave_up", 2, 4),  # an error that is not retried ends the retries too
    ]
    assert len({e.request for e in events}) == 3, "one id per request across its attempts"
    assert "engine on fire" in events[0].error and events[0].delay_s is not None and events[2].delay_s is None


async def test_an_aborted_retry_is_reported_as_ended(fault_server: FaultServer) -> None:
    aborted = False
    fault_server.behaviours = [status(503, {"message": "busy"})] * 100
    async with make_client(fault_server.url, retry_delay=0.05, max_retry_delay=0.05) as client:
        with _retry_events() as events:
            request = asyncio.ensure_future(client.generate([1], {}, abort_check=lambda: aborted))
            await wait_until(lambda: len(events) >= 2, what="two retries")
            aborted = True
            with pytest.raises(SGLangAbortedError):
                await request
    assert events[-1].outcome == "ended" and {e.outcome for e in events[:-1]} == {"retrying"}


async def test_unreachable_server_raises_connection_error() -> None:
    async with make_client("http://127.0.0.1:9", max_retries=2) as client:
        with pytest.raises(SGLangConnectionError, match="3 attempts"):
            await client.generate([1], {})


async def test_backoff_grows_exponentially_with_cap() -> None:
    client = SGLangClient("http://x", retry_delay=1.0, max_retry_delay=8.0)
    delays = [client._backoff(a) for a in range(6)]
    for attempt, delay in enumerate(delays):
        bound = min(8.0, 2.0**attempt)
        assert bound / 2 <= delay <= bound


async def test_2000_requests_through_100_connection_pool(fault_server: FaultServer) -> None:
    fault_server.delay = 0.002
    async with make_client(fault_server.url, max_connections=100, max_retries=0) as client:
        results = await asyncio.gather(*(client.generate([i + 1], {}) for i in range(2000)))
    assert len(results) == 2000 and all(r.output_ids == [6023, 151645] for r in results)
    assert len(fault_server.requests) == 2000
    assert fault_server.max_in_flight <= 100


async def test_pool_wait_is_not_a_timeout(fault_server: FaultServer) -> None:
    """Requests queued for a connection wait as long as needed (no 5 s pool timeout)."""
    fault_server.delay = 0.3
    async with make_client(
        fault_server.url, max_connections=1, connect_timeout=0.05, max_retries=0
    ) as client:
        results = await asyncio.gather(*(client.generate([1], {}) for _ in range(4)))
    assert len(results) == 4


async def test_abort_replies_parse_without_prompt_tokens(fault_server: FaultServer) -> None:
    queued = {
        "text": "",
        "output_ids": [],
        "meta_info": {
            "id": "q",
            "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
            "weight_version": "default",
            "e2e_latency": 0.2,
            "output_token_logprobs": [],
            "completion_tokens": 0,
        },
    }
    running = json.loads(json.dumps(OK_BODY))
    running["meta_info"]["finish_reason"] = {"type": "abort", "message": "Aborted", "status_code": None}
    fault_server.behaviours = [status(200, queued), status(200, running)]
    async with make_client(fault_server.url) as client:
        first = await client.generate([1], {})
        second = await client.generate([1], {})
    assert first.is_abort and first.prompt_tokens is None and first.output_ids == []
    assert first.cached_tokens == 0 and first.completion_tokens == 0
    assert second.is_abort and second.output_ids == [6023, 151645]


async def test_inconsistent_logprobs_are_rejected(fault_server: FaultServer) -> None:
    bad = json.loads(json.dumps(OK_BODY))
    bad["meta_info"]["output_token_logprobs"] = [[-0.5, 1, None]]
    fault_server.behaviours = [status(200, bad)] * 3
    async with make_client(fault_server.url, max_retries=0) as client:
        with pytest.raises(SGLangDecodingError, match="2 output_ids but 1"):
            await client.generate([1], {})


@pytest.mark.parametrize(
    ("entries", "match"),
    [
        ([[-0.5, 6023, None], [-0.1]], "malformed logprob entries"),  # an entry without its id
        ([[-0.5, 6023, None], ["low", 151645, None]], "malformed logprob entries"),
        ([[-0.5, 6023, None], [-0.1, 7, None]], "disagree"),
    ],
)
def test_malformed_logprob_entries_are_one_decoding_error(entries: list[Any], match: str) -> None:
    body = json.loads(json.dumps(OK_BODY))
    body["meta_info"]["output_token_logprobs"] = entries
    with pytest.raises(SGLangDecodingError, match=match):
        GenerateResponse.parse(body)


def test_logprobs_of_another_json_number_type_are_floats() -> None:
    body = json.loads(json.dumps(OK_BODY))
    body["meta_info"]["output_token_logprobs"] = [[0, 6023, None], [None, 151645, None]]
    reply = GenerateResponse.parse(body)
    assert reply.output_logprobs == [0.0, None] and type(reply.output_logprobs[0]) is float


async def test_max_model_len_cached_and_failures_expire(fault_server: FaultServer) -> None:
    fault_server.behaviours = [status(500, {"error": "boom"})] * 4
    client = make_client(fault_server.url, metadata_ttl_on_error=0.2)
    with pytest.raises(SGLangHTTPError):
        await client.max_model_len()
    with pytest.raises(SGLangHTTPError):  # still inside the negative-cache window: no new request
        await client.max_model_len()

    async def recovered() -> bool:
        try:
            return await client.max_model_len() == 4096
        except SGLangHTTPError:  # the cached failure, until metadata_ttl_on_error has passed
            return False

    await wait_until(recovered, what="the cached failure to expire")
    assert await client.max_model_len() == 4096
    await client.close()


@pytest.mark.parametrize("max_retries", [0, 1, 60])
async def test_metadata_fetches_honour_max_retries(fault_server: FaultServer, max_retries: int) -> None:
    """``max_retries=0`` is one attempt for metadata too (it was four, with seconds of backoff);
    larger values are capped at three retries so start-up never waits a generation's retry budget."""
    fault_server.behaviours = [status(503, {"error": "busy"})] * 10
    async with make_client(fault_server.url, max_retries=max_retries) as client:
        assert client.metadata_retries == min(max_retries, 3)
        with pytest.raises(SGLangThrottledError):
            await client.max_model_len()
    assert len(fault_server.behaviours) == 10 - (min(max_retries, 3) + 1)


@pytest.mark.parametrize(("max_retries", "attempts"), [(0, 1), (60, 4)])
async def test_abort_requests_honour_max_retries(max_retries: int, attempts: int) -> None:
    async with make_client("http://127.0.0.1:9", max_retries=max_retries) as client:
        with pytest.raises(SGLangConnectionError) as raised:
            await client.abort("r1")
    assert ("gave up after" in str(raised.value)) == (attempts > 1)
    if attempts > 1:
        assert f"gave up after {attempts} attempts" in str(raised.value)


async def test_concurrent_first_use_is_single_flight(fault_server: FaultServer) -> None:
    calls = 0

    async def slow_models(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return web.json_response({"data": [{"max_model_len": 2048}]})

    fault_server.behaviours = [slow_models] * 5
    async with make_client(fault_server.url) as client:
        values = await asyncio.gather(*(client.max_model_len() for _ in range(20)))
    assert values == [2048] * 20 and calls == 1


@pytest.mark.parametrize(
    ("info", "reserved"),
    [
        ({"speculative_algorithm": None, "speculative_num_draft_tokens": None}, 0),
        (
            {
                "speculative_algorithm": "EAGLE",
                "speculative_eagle_topk": 4,
                "speculative_num_steps": 5,
                "speculative_num_draft_tokens": 8,
            },
            20,
        ),
        (
            {
                "speculative_algorithm": "EAGLE3",
                "speculative_eagle_topk": 1,
                "speculative_num_steps": 3,
                "speculative_num_draft_tokens": 4,
            },
            4,
        ),
        ({"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 12}, 0),
    ],
)
async def test_reserved_context_tokens_follow_sglang(
    fault_server: FaultServer, info: Any, reserved: int
) -> None:
    """SGLang 0.5.23 ``srt/managers/utils.py`` ``compute_num_reserved_tokens``: only
    ``SpeculativeAlgorithm.is_eagle()`` reserves ``max(eagle_topk * num_steps, num_draft_tokens)``."""
    fault_server.server_info = info
    async with make_client(fault_server.url) as client:
        assert client.known_context_length() is None
        assert await client.reserved_context_tokens() == reserved
        assert await client.usable_context_length() == 4096 - reserved
        assert client.known_context_length() == 4096 - reserved  # every later model call reads it


async def test_usable_context_without_server_info(fault_server: FaultServer) -> None:
    async with make_client(fault_server.url) as client:
        with pytest.raises(SGLangHTTPError):
            await client.reserved_context_tokens()
        assert await client.usable_context_length() == 4096
        assert client.known_context_length() is None, "without /server_info the next call asks again"
    fault_server.server_info = {"speculative_algorithm": "EAGLE", "speculative_num_steps": "three"}
    async with make_client(fault_server.url) as client:
        with pytest.raises(SGLangDecodingError, match="malformed speculative settings"):
            await client.reserved_context_tokens()


async def test_health(fault_server: FaultServer) -> None:
    async with make_client(fault_server.url) as client:
        assert await client.health() is True
    async with make_client("http://127.0.0.1:9") as client:
        assert await client.health() is False


def test_client_works_across_event_loops_without_warnings(fault_server_thread: str) -> None:
    client = make_client(fault_server_thread)

    async def one_call() -> list[int]:
        return (await client.generate([1], {})).output_ids

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        assert asyncio.run(one_call()) == [6023, 151645]
        assert asyncio.run(one_call()) == [6023, 151645]
        gc.collect()


def test_from_slime_args_uses_router_and_pool_formula() -> None:
    class Args:
        sglang_router_ip = "10.0.0.1"
        sglang_router_port = 30000
        sglang_server_concurrency = 512
        rollout_num_gpus = 8
        rollout_num_gpus_per_engine = 2

    client = SGLangClient.from_slime_args(Args())
    assert client.base_url == "http://10.0.0.1:30000"
    assert client.max_connections == 2048
    with pytest.raises(ValueError, match="sglang_router_ip"):
        SGLangClient.from_slime_args(object())


@pytest.fixture
def fault_server_thread() -> Any:
    """A FaultServer on its own loop in a thread, for tests that run several event loops."""

    def build() -> web.Application:
        server = FaultServer()
        app = web.Application()
        app.router.add_post("/generate", server.handle_generate)
        return app

    with serve_app_in_thread(build) as url:
        yield url


async def test_timeout_is_retried_then_raised(fault_server: FaultServer) -> None:
    fault_server.delay = 0.5
    start = time.monotonic()
    async with make_client(fault_server.url, timeout=0.05, max_retries=1) as client:
        with pytest.raises(SGLangConnectionError, match="Timeout"):
            await client.generate([1], {})
    assert time.monotonic() - start < 0.5


# ---------------------------------------------------------------------------------------- aborts


def shipped_retry_client(url: str, **kwargs: Any) -> SGLangClient:
    """The retry policy of configs/strands_math.yaml: 60 retries, 1 s doubling to 30 s."""
    return SGLangClient(url, max_retries=60, retry_delay=1.0, max_retry_delay=30.0, **kwargs)


async def raises_aborted_within(task: asyncio.Future[Any], seconds: float) -> float:
    """Await ``task`` (which must raise SGLangAbortedError) and return how long it took."""
    start = time.monotonic()
    with pytest.raises(SGLangAbortedError, match="aborted"):
        await asyncio.wait_for(task, 5)
    elapsed = time.monotonic() - start
    assert elapsed < seconds, f"took {elapsed:.3f} s to stop after the abort"
    return elapsed


@pytest.mark.slow  # watches 2.5 s
async def test_abort_cuts_the_retry_backoff_and_nothing_is_sent_after(fault_server: FaultServer) -> None:
    fault_server.behaviours = [status(503, {"message": "busy"})] * 100
    aborted = threading.Event()
    async with shipped_retry_client(fault_server.url) as client:
        task = asyncio.ensure_future(client.generate([1], {}, abort_check=aborted.is_set))
        await wait_until(lambda: len(fault_server.requests) >= 2)  # now in a 1-2 s backoff sleep
        aborted.set()
        await raises_aborted_within(task, 0.3)
        sent = len(fault_server.requests)
        await asyncio.sleep(2.5)  # longer than the next backoff would have been
    assert len(fault_server.requests) == sent == 2


async def test_abort_while_waiting_for_a_pooled_connection(fault_server: FaultServer) -> None:
    fault_server.delay = 3.0
    aborted = threading.Event()
    async with make_client(fault_server.url, max_connections=1) as client:
        holder = asyncio.ensure_future(client.generate([1], {}))  # takes the only connection
        await wait_until(lambda: len(fault_server.requests) == 1)
        waiter = asyncio.ensure_future(client.generate([2], {}, abort_check=aborted.is_set))
        await wait_until(lambda: client.waiting_for_connection() == 1, what="the second request to queue")
        aborted.set()
        await raises_aborted_within(waiter, 0.3)
        holder.cancel()
    assert [r["input_ids"] for r in fault_server.requests] == [[1]], "the queued request was never sent"


async def test_abort_while_reading_the_reply(fault_server: FaultServer) -> None:
    fault_server.delay = 30.0
    aborted = threading.Event()
    async with shipped_retry_client(fault_server.url) as client:
        task = asyncio.ensure_future(client.generate([1], {}, abort_check=aborted.is_set))
        await wait_until(lambda: fault_server.in_flight == 1)
        aborted.set()
        await raises_aborted_within(task, 0.3)


async def test_set_abort_flag_sends_nothing(fault_server: FaultServer) -> None:
    async with make_client(fault_server.url) as client:
        with pytest.raises(SGLangAbortedError, match="not started"):
            await client.generate([1], {}, abort_check=lambda: True)
    assert fault_server.requests == []


async def test_one_abort_flag_stops_many_requests_and_the_watcher_ends(fault_server: FaultServer) -> None:
    from strands_slime.aborts import _ABORT_WATCHES

    fault_server.delay = 30.0
    aborted = threading.Event()
    async with shipped_retry_client(fault_server.url, max_connections=50) as client:
        tasks = [
            asyncio.ensure_future(client.generate([i + 1], {}, abort_check=aborted.is_set))
            for i in range(200)
        ]
        await wait_until(lambda: fault_server.in_flight == 50)
        aborted.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 2)
        assert all(isinstance(r, SGLangAbortedError) for r in results)
        watch = _ABORT_WATCHES[asyncio.get_running_loop()]
        assert not watch._waiting
        poller = watch._poller
        assert poller is not None
        await wait_until(poller.done, timeout=2, what="the poller to stop when nothing waits")
    assert len(fault_server.requests) == 50


async def test_an_abort_while_the_connection_opens_sends_nothing(fault_server: FaultServer) -> None:
    """The flag is read again after the connection is ready, right before the first byte: an abort
    that lands after the attempt's own check (while connecting, or while the watcher is still
    cancelling a large rollout's other requests) sends nothing."""
    from strands_slime.provider import client as client_module

    def set_once_the_attempt_checked() -> bool:
        return client_module._SEND_GUARD.get() is not None  # false at the attempt's check, true at the write

    async with make_client(fault_server.url) as client:
        with pytest.raises(SGLangAbortedError, match="was not sent: the rollout was aborted"):
            await client.generate([1], {}, abort_check=set_once_the_attempt_checked)
        await client.generate([2], {})  # the client (and its pool) still works
    assert [r["input_ids"] for r in fault_server.requests] == [[2]], "the aborted request was never sent"


async def test_an_abort_on_a_pooled_connection_sends_nothing(fault_server: FaultServer) -> None:
    """The same read when the connection comes from the pool (a keep-alive one: no connecting at all)."""
    from strands_slime.provider import client as client_module

    async with make_client(fault_server.url) as client:
        await client.generate([1], {})
        with pytest.raises(SGLangAbortedError, match="was not sent: the rollout was aborted"):
            await client.generate([2], {}, abort_check=lambda: client_module._SEND_GUARD.get() is not None)
        await client.generate([3], {})
    assert [r["input_ids"] for r in fault_server.requests] == [[1], [3]]


def test_aiohttp_writes_the_request_as_soon_as_the_connector_returns() -> None:
    """What the abort read in ``_GuardedConnector.connect`` relies on, pinned against the installed
    aiohttp: in ``ClientSession._request`` the first await after ``connector.connect`` is ``req.send``.
    An upgrade that awaits anything in between (where an abort could land unread) fails here: move the
    read to wherever aiohttp then writes the first byte (docs/provider.md, "Aborts")."""
    import ast
    import inspect
    import textwrap

    import aiohttp

    tree = ast.parse(textwrap.dedent(inspect.getsource(aiohttp.ClientSession._request)))
    awaits = sorted(
        (node for node in ast.walk(tree) if isinstance(node, ast.Await)),
        key=lambda n: (n.lineno, n.col_offset),
    )
    called = [ast.unparse(node.value.func) if isinstance(node.value, ast.Call) else "" for node in awaits]
    assert "self._connector.connect" in called, (
        f"aiohttp {aiohttp.__version__} no longer awaits connector.connect"
    )
    after = called[called.index("self._connector.connect") + 1]
    assert after == "req.send", f"aiohttp {aiohttp.__version__} awaits {after} between connect and send"


async def test_caller_cancellation_stays_a_cancellation(fault_server: FaultServer) -> None:
    fault_server.delay = 30.0
    async with make_client(fault_server.url) as client:
        task = asyncio.ensure_future(client.generate([1], {}, abort_check=lambda: False))
        await wait_until(lambda: fault_server.in_flight == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# ---------------------------------------------------------------------------------------- deadlines


@pytest.fixture
async def raw_server() -> AsyncIterator[tuple[str, list[bytes], dict[str, bytes]]]:
    """A TCP server that reads a request and answers ``reply["bytes"]`` (maybe nothing), then hangs."""
    connections: list[bytes] = []
    reply: dict[str, bytes] = {"bytes": b""}
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        connections.append(await reader.readuntil(b"\r\n\r\n"))
        if reply["bytes"]:
            writer.write(reply["bytes"])
            await writer.drain()
        await asyncio.sleep(3600)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", connections, reply
    for writer in writers:
        writer.close()
    server.close()


async def test_hanging_server_ends_with_a_first_byte_timeout(raw_server: Any) -> None:
    url, connections, _ = raw_server
    start = time.monotonic()
    async with make_client(url, first_byte_timeout=0.3, max_retries=5) as client:
        with pytest.raises(SGLangTimeoutError, match=r"sent nothing for first_byte_timeout_s=0\.3") as info:
            await client.generate([1], {})
    assert 0.3 <= time.monotonic() - start < 2.0
    assert len(connections) == 1, "a reply that never starts is not retried"
    assert not info.value.retryable


async def test_reply_stalled_mid_body_ends_with_a_stall_timeout(raw_server: Any) -> None:
    url, connections, reply = raw_server
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    reply["bytes"] = head + b'{"text": "hel'
    start = time.monotonic()
    async with make_client(url, stall_timeout=0.3, first_byte_timeout=60, max_retries=1) as client:
        with pytest.raises(SGLangTimeoutError, match=r"stalled, no bytes for stall_timeout_s=0\.3") as info:
            await client.generate([1], {})
    assert 0.6 <= time.monotonic() - start < 3.0
    assert len(connections) == 2, "a stalled reply is retried like a reset connection"
    assert "gave up after 2 attempts" in str(info.value)


def test_stall_and_first_byte_timeouts_are_on_by_default() -> None:
    from strands_slime.config import ClientConfig, load_config

    client = SGLangClient("http://x")
    assert client.first_byte_timeout == 3600.0 and client.stall_timeout == 60.0
    assert ClientConfig().first_byte_timeout_s == 3600.0 and ClientConfig().stall_timeout_s == 60.0
    shipped = load_config(Path(__file__).parents[1] / "configs" / "strands_math.yaml").client
    assert shipped.first_byte_timeout_s and shipped.stall_timeout_s
    with pytest.raises(ValueError, match="stall_timeout"):
        SGLangClient("http://x", stall_timeout=0)


async def test_timeout_counts_the_wire_not_the_pool_wait(fault_server: FaultServer) -> None:
    """Pool of 2, 16 requests of 0.25 s each: 2 s in all, but each one well inside its 1 s timeout."""
    fault_server.delay = 0.25
    start = time.monotonic()
    async with make_client(fault_server.url, max_connections=2, timeout=1.0, max_retries=3) as client:
        results = await asyncio.gather(*(client.generate([i + 1], {}) for i in range(16)))
    assert time.monotonic() - start >= 1.9, "the requests queued for the two connections"
    assert len(results) == 16
    assert len(fault_server.requests) == 16, "no timeout, so no retry"
    assert fault_server.max_in_flight <= 2
