"""Every abort and error path SGLangClient classifies, produced by the real SGLang server.

400s (each validation stage), the context-length family, a full queue and a waiting timeout (503), a
running and a queued request aborted by ``/abort_request``, and the caller's own abort flag.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sglang_server import CONTEXT_LENGTH, SGLangServer
from waiting import wait_until

from strands_slime.provider.client import (
    GenerateResponse,
    SGLangAbortedError,
    SGLangBadRequestError,
    SGLangClient,
    SGLangContextLengthError,
    SGLangThrottledError,
)

pytestmark = pytest.mark.sglang

WAITING_TIMEOUT_S = 15
LONG = {"max_new_tokens": 3000, "ignore_eos": True}
"""A generation that runs for many seconds on the CPU, until it is aborted."""


@pytest.fixture(scope="module")
def tight(checkpoints: dict[int, Path], lane_dir: Path) -> Iterator[SGLangServer]:
    """One running slot, one queue place, and SGLang's waiting timeout."""
    with SGLangServer(
        checkpoints[0],
        lane_dir,
        name="tight",
        args=("--max-running-requests", "1", "--max-queued-requests", "1"),
        env={"SGLANG_REQ_WAITING_TIMEOUT": str(WAITING_TIMEOUT_S)},
    ) as server:
        yield server


@pytest.fixture
async def client(sglang: SGLangServer) -> AsyncIterator[SGLangClient]:
    async with SGLangClient(sglang.url, max_retries=0) as c:
        yield c


async def loads(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(url + "/v1/loads?include=core") as reply:
        return (await reply.json())["loads"][0]


async def running_and_waiting(url: str, since: float = 0.0) -> tuple[int, int] | None:
    """SGLang's running and waiting counts, from a load snapshot taken after ``since`` (the snapshots
    lag the scheduler by up to seconds); None while there is no such snapshot yet."""
    load = await loads(url)
    if load["timestamp"] <= since:
        return None
    return load["num_running_reqs"], load["num_waiting_reqs"]


async def test_each_validation_stage_is_a_bad_request(client: SGLangClient) -> None:
    cases = [
        ({"rid": 5}, "Input should be a valid string"),  # E1: pydantic
        ({"sampling_params": {"foo": 1}}, "unknown field `foo`"),  # E2: the schema contract
        ({"return_logprob": "yes"}, "expected a value or an array of values for BoolOrList"),  # E2
        ({"sampling_params": {"temperature": -1}}, "temperature must be a non-negative finite number"),
        ({"sampling_params": {"ebnf": "root ::= "}}, "Failed to compile ebnf grammar"),
        ({"sampling_params": {"regex": "("}}, "Failed to compile regex grammar"),
        ({"logprob_start_len": 10}, "is higher than the number of input tokens"),
    ]
    for extra, message in cases:
        body = {
            "input_ids": [1, 2, 3],
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 4},
            **extra,
        }
        with pytest.raises(SGLangBadRequestError, match=re.escape(message)) as raised:
            # raw: generate() itself refuses a wrongly typed value before sending (test_bad_ids.py)
            await client.request("POST", "/generate", payload=body, max_retries=0)
        assert raised.value.status == 400 and not raised.value.retryable
        assert not isinstance(raised.value, SGLangContextLengthError), message


async def test_the_context_length_family(client: SGLangClient) -> None:
    cases = [
        (
            CONTEXT_LENGTH,
            {},
            f"The input ({CONTEXT_LENGTH} tokens) is longer than the model's context length",
        ),
        (
            100,
            {"max_new_tokens": CONTEXT_LENGTH},
            "Requested token count exceeds the model's maximum context length",
        ),
        (CONTEXT_LENGTH - 3, {}, "exceeds the maximum allowed length"),
    ]
    for length, params, message in cases:
        with pytest.raises(SGLangContextLengthError, match=re.escape(message)):
            await client.generate([7] * length, params)
    # what fits is clipped silently: the length finish reports the clipped budget
    reply = await client.generate([7] * (CONTEXT_LENGTH - 10), {"max_new_tokens": None, "ignore_eos": True})
    assert reply.finish_reason is not None and reply.finish_reason.type == "length"
    assert (
        reply.finish_reason.length
        == reply.completion_tokens
        == CONTEXT_LENGTH - 1 - (CONTEXT_LENGTH - 10) - 1
    )


async def test_a_running_request_aborted_by_rid_returns_its_partial_output(
    client: SGLangClient, sglang: SGLangServer
) -> None:
    task = asyncio.create_task(client.generate(list(range(10, 30)), LONG, rid="job"))
    other = asyncio.create_task(client.generate(list(range(40, 60)), LONG, rid="job-2"))
    await wait_until(lambda: _running(sglang.url, 2), what="both requests running", timeout=60)
    await client.abort("job")  # an exact live rid; every live rid starting with it is aborted too
    for reply in await asyncio.gather(task, other):
        assert_aborted_while_running(reply)
    aborted = time.time()
    await wait_until(lambda: _idle(sglang.url, aborted), what="SGLang idle", timeout=60)


async def _running(url: str, count: int, since: float = 0.0) -> bool:
    counts = await running_and_waiting(url, since)
    return counts is not None and counts[0] >= count


def assert_aborted_while_running(reply: GenerateResponse) -> None:
    assert reply.is_abort and reply.finish_reason is not None
    assert reply.finish_reason.raw == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    assert 1 <= len(reply.output_ids) < LONG["max_new_tokens"]
    assert len(reply.output_logprobs) == len(reply.output_ids) == reply.completion_tokens
    assert reply.prompt_tokens == 20


async def test_the_callers_abort_flag_cuts_the_wait_and_sglang_drops_the_request(
    client: SGLangClient, sglang: SGLangServer
) -> None:
    aborted = False
    task = asyncio.create_task(client.generate(list(range(10, 30)), LONG, abort_check=lambda: aborted))
    await wait_until(lambda: _running(sglang.url, 1), what="the request running")
    aborted = True
    with pytest.raises(SGLangAbortedError, match="cut short"):
        await task
    # the closed connection is SGLang's client-disconnect abort
    dropped = time.time()
    await wait_until(lambda: _idle(sglang.url, dropped), what="SGLang to drop the request", timeout=60)


async def _idle(url: str, since: float = 0.0) -> bool:
    return await running_and_waiting(url, since) == (0, 0)


async def test_full_queue_waiting_timeout_and_queued_abort(tight: SGLangServer) -> None:
    async with SGLangClient(tight.url, max_retries=0) as client:
        running = asyncio.create_task(client.generate(list(range(10, 30)), LONG, rid="running"))
        await wait_until(lambda: _running(tight.url, 1), what="the first request running", timeout=60)
        sent = time.time()
        queued = asyncio.create_task(
            client.generate(list(range(10, 30)), {"max_new_tokens": 4}, rid="queued")
        )
        await wait_until(lambda: _waiting(tight.url, 1, sent), what="the second request queued", timeout=60)
        with pytest.raises(SGLangThrottledError, match="The request queue is full") as full:
            await client.generate([1, 2, 3], {"max_new_tokens": 4})
        assert full.value.status == 503 and full.value.retryable
        with pytest.raises(SGLangThrottledError, match="Request waiting timeout reached") as timed_out:
            await queued
        assert timed_out.value.status == 503
        # a queued request aborted by rid: 200, no output, and no prompt_tokens/cached_tokens
        sent = time.time()
        queued = asyncio.create_task(client.generate(list(range(10, 30)), {"max_new_tokens": 4}, rid="later"))
        await wait_until(lambda: _waiting(tight.url, 1, sent), what="the third request queued", timeout=60)
        await client.abort("later")
        reply = await queued
        assert reply.is_abort and reply.output_ids == [] and reply.prompt_tokens is None
        assert reply.finish_reason is not None and reply.finish_reason.message == "Abort in waiting queue"
        assert "cached_tokens" not in reply.meta_info
        await client.abort(abort_all=True)
        assert_aborted_while_running(await running)


async def _waiting(url: str, count: int, since: float) -> bool:
    counts = await running_and_waiting(url, since)
    return counts is not None and counts[1] >= count
