"""Partial-rollout resume through the episode executor: a recycled ABORTED sample goes on in a worker
where it stopped, with the result the in-process resume gives for the same aborted sample.

Real parts: worker processes, the scripted dev server over loopback, the real tokenizer and sandbox.
Each aborted sample is resumed twice from identical copies, once in-process and once through the
workers, and the two results are compared field by field. The tests share one event loop and one
executor (starting a worker costs seconds of CPU).
"""

from __future__ import annotations

import array
import asyncio
import copy
import logging
import pickle
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from helpers import think, tool_call
from test_executor import comparable, wait_until
from test_resume import (
    PARAMS,
    SCRIPT,
    Aborter,
    SandboxCounter,
    assert_same_trajectory,
    check_invariants,
    make_args,
    model_turns,
    new_sample,
)

from strands_slime import generate
from strands_slime.config import get_rollout_config
from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangClient
from strands_slime.rollout import episode as rollout
from strands_slime.rollout import executor
from strands_slime.rollout.resume import STATE_KEY
from strands_slime.rollout.slime_compat import Sample

pytestmark = pytest.mark.unit

STAMP_CODE = "import time\nprint(time.time_ns())"
"""A tool whose output differs on every run: a call that ran again would change the tokens."""
STAMP_SCRIPT = [
    {
        "match": "stamp",
        "replies": [
            think("Take a stamp.", tool_call(STAMP_CODE)),
            think("Stamped.", "The result is 34.\n\nAnswer: \\boxed{34}"),
        ],
    },
    *SCRIPT,
]
IN_PROCESS = {"sandbox": {"timeout_s": 5.0}, "client": {"max_retries": 0}}
IN_WORKERS = {**IN_PROCESS, "executor": {"workers": 1, "oversubscribe": True}}

shared_loop = pytest.mark.asyncio(loop_scope="module")


def test_resume_fields_are_every_result_field_that_is_not_an_input() -> None:
    """A resumed sample reaches the worker with everything the in-process path would find on it."""
    inputs = set(executor.SAMPLE_INPUT_FIELDS)
    assert set(rollout.RESUME_FIELDS) == set(rollout.SAMPLE_RESULT_FIELDS) - inputs
    assert not set(rollout.RESUME_FIELDS) & inputs


def test_kept_fields_travel_as_arrays_and_come_back_equal() -> None:
    sample = Sample(prompt="p", tokens=list(range(151_000, 151_000 + 3000)), response_length=2000)
    sample.loss_mask = [1] * 2000
    sample.rollout_log_probs = [-0.25] * 2000
    sample.weight_versions = ["v1"]
    sample.status = Sample.Status.ABORTED
    packed = executor.pack_fields(sample, rollout.RESUME_FIELDS)
    assert "metadata" not in packed and "prompt" not in packed, "inputs travel once"
    for name in ("tokens", "loss_mask", "rollout_log_probs"):  # one block of bytes, not an object per item
        assert type(packed[name]) is array.array, name
    assert len(pickle.dumps(packed, protocol=5)) < 3000 * 4 + 2000 * (4 + 8) + 1000
    target = Sample(prompt="p")
    executor.apply_result(target, pickle.loads(pickle.dumps(packed, protocol=5)))
    for name in ("tokens", "loss_mask", "rollout_log_probs", "response_length", "weight_versions"):
        assert getattr(target, name) == getattr(sample, name), name
    assert target.status is Sample.Status.ABORTED and isinstance(target.spec_info, Sample.SpecInfo)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[DevServer]:
    async with DevServer(backend="scripted", script=STAMP_SCRIPT) as running:
        yield running
        await executor.shutdown_executors()


def in_workers(url: str, **overrides: Any) -> Any:
    return make_args(url, strands_slime=IN_WORKERS, **overrides)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def workers(server: DevServer) -> executor.EpisodeExecutor:
    args = in_workers(server.url)
    return await executor.get_executor(args, get_rollout_config(args))


async def resume_both_ways(server: DevServer, aborted: Sample) -> tuple[Sample, Sample, int, int]:
    """Resume identical copies of ``aborted`` in-process and through the workers; returns both results
    and the model requests each sent."""
    local_copy = pickle.loads(pickle.dumps(aborted))  # as slime's buffer may hold it
    remote_copy = pickle.loads(pickle.dumps(aborted))
    # a model call the abort cut short goes on from its partial output once: the scripted server
    # forgets it when it answers; the second resume gets the same chance
    continuations = copy.deepcopy(server.backend._continuations)
    before = len(server.request_log)
    local = await generate(make_args(server.url, strands_slime=IN_PROCESS), local_copy, dict(PARAMS))
    local_requests = len(server.request_log) - before
    server.backend._continuations.update(copy.deepcopy(continuations))
    before = len(server.request_log)
    remote = await generate(in_workers(server.url), remote_copy, dict(PARAMS))
    assert remote is remote_copy, "the result is written onto slime's own sample"
    return local, remote, local_requests, len(server.request_log) - before


@pytest.mark.slow
@shared_loop
async def test_abort_after_a_tool_result_resumes_in_the_worker_without_running_it_again(
    server: DevServer, workers: executor.EpisodeExecutor
) -> None:
    counter = SandboxCounter()
    aborter = Aborter(lambda caller: caller == "_turn" and counter.finished == 1)
    args = make_args(server.url, abort_event=aborter, strands_slime=IN_PROCESS)
    await counter.install(args)
    aborted = await generate(args, new_sample("stamp"), dict(PARAMS))
    assert aborted.status.name == "ABORTED" and model_turns(aborted) == 1
    messages = aborted.metadata[STATE_KEY]["messages"]
    stamp = messages[-1]["content"][0]["toolResult"]["content"][0]["text"].strip()
    assert stamp.isdigit()
    episodes = workers.stats.episodes

    local, remote, local_requests, remote_requests = await resume_both_ways(server, aborted)

    assert workers.stats.episodes == episodes + 1, "the resumed episode ran in a worker"
    check_invariants(remote)
    assert remote.status.name == "COMPLETED" and STATE_KEY not in remote.metadata
    assert comparable(remote) == comparable(local)
    assert remote.tokens[: len(aborted.tokens)] == aborted.tokens, "the kept part went on"
    assert stamp in remote.response, "the finished tool call was answered from its saved result"
    assert remote_requests == local_requests == 1, "only the second model call was made"
    assert remote.metadata["resumes"] == 1 and "restarts" not in remote.metadata
    assert remote.metadata["tool_calls"] == 1 and remote.metadata["turns"] == 2


@pytest.mark.slow
@shared_loop
async def test_abort_mid_generation_in_a_worker_resumes_only_the_cut_call(
    server: DevServer, workers: executor.EpisodeExecutor
) -> None:
    expected = await generate(
        make_args(server.url, strands_slime=IN_PROCESS), new_sample("twice"), dict(PARAMS)
    )
    assert expected.status.name == "COMPLETED"
    flag = threading.Event()
    args = in_workers(server.url, abort_event=flag)
    scheduler = server.scheduler
    assert scheduler is not None
    before = len(server.request_log)
    scheduler.token_latency = 0.005
    try:
        task = asyncio.ensure_future(generate(args, new_sample("twice"), dict(PARAMS)))
        await wait_until(
            lambda: len(server.request_log) >= before + 3 and scheduler.num_running > 0,
            60,
            "the third model call at the server",
        )
        generated = scheduler.total_generated_tokens
        await wait_until(lambda: scheduler.total_generated_tokens >= generated + 5, 30, "its first tokens")
        flag.set()  # what slime's abort() does: the flag, then abort every request
        async with SGLangClient(server.url) as client:
            await client.abort(abort_all=True)
        aborted = await asyncio.wait_for(task, 10)
    finally:
        scheduler.token_latency = 0.0
    assert aborted.status.name == "ABORTED" and aborted.metadata["abort_source"] == "slime"
    assert STATE_KEY in aborted.metadata, "the worker's saved state came back onto slime's sample"
    check_invariants(aborted)
    cut_kept = len(aborted.weight_versions) - 2
    assert cut_kept in (0, 1) and model_turns(aborted) == 2 + cut_kept

    local, remote, local_requests, remote_requests = await resume_both_ways(server, aborted)

    assert comparable(remote) == comparable(local)
    assert_same_trajectory(remote, expected, continued_calls=cut_kept)
    assert remote_requests == local_requests == 1, "only the cut call was sent again"
    resent = server.request_log[-1]["json"]["input_ids"]
    assert resent[: len(aborted.tokens)] == aborted.tokens, "the resumed call extends the saved ids"
    assert remote.metadata["resumes"] == 1 and remote.metadata["tool_calls"] == 2


@pytest.mark.slow
@shared_loop
async def test_aborted_again_before_the_worker_resumes_keeps_the_saved_part(
    server: DevServer, workers: executor.EpisodeExecutor
) -> None:
    counter = SandboxCounter()
    aborter = Aborter(lambda caller: caller == "_turn" and counter.finished == 1)
    args = make_args(server.url, abort_event=aborter, strands_slime=IN_PROCESS)
    await counter.install(args)
    aborted = await generate(args, new_sample("seventeen"), dict(PARAMS))
    assert aborted.status.name == "ABORTED" and STATE_KEY in aborted.metadata
    saved = copy.deepcopy(aborted)
    flag = threading.Event()
    flag.set()  # slime is still aborting when the recycled sample comes back
    before = len(server.request_log)
    again = await generate(in_workers(server.url, abort_event=flag), aborted, dict(PARAMS))
    assert again.status.name == "ABORTED" and len(server.request_log) == before
    assert again.tokens == saved.tokens and again.loss_mask == saved.loss_mask
    assert again.metadata[STATE_KEY] == saved.metadata[STATE_KEY]
    flag.clear()
    resumed = await generate(in_workers(server.url, abort_event=flag), again, dict(PARAMS))
    check_invariants(resumed)
    assert resumed.status.name == "COMPLETED" and resumed.metadata["resumes"] == 1
    assert resumed.tokens[: len(saved.tokens)] == saved.tokens


@pytest.mark.slow
@shared_loop
async def test_a_state_that_does_not_fit_starts_over_in_the_worker_with_a_warning(
    server: DevServer, workers: executor.EpisodeExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    counter = SandboxCounter()
    aborter = Aborter(lambda caller: caller == "_turn" and counter.finished == 1)
    args = make_args(server.url, abort_event=aborter, strands_slime=IN_PROCESS)
    await counter.install(args)
    aborted = await generate(args, new_sample("seventeen"), dict(PARAMS))
    assert STATE_KEY in aborted.metadata
    aborted.tokens.append(7)  # changed since the state was saved
    before = len(server.request_log)
    with caplog.at_level(logging.WARNING, logger="strands_slime.rollout.resume"):
        again = await generate(in_workers(server.url), aborted, dict(PARAMS))
    check_invariants(again)
    assert again.status.name == "COMPLETED" and again.metadata["restarts"] == 1
    assert STATE_KEY not in again.metadata and "resumes" not in again.metadata
    assert len(server.request_log) - before == 2, "both model calls ran again, from scratch"
    assert any("starting the episode over" in r.getMessage() for r in caplog.records)
