"""The episode executor inside the package: the runtime owns it (closing or resetting the runtime
stops the worker processes), the offline CLI stops it at the end of a run and on SIGINT, and fan-out
runs through it.

Real worker processes against the dev server over loopback, through ``generate``; each test starts
at least one worker (seconds of CPU), so all are in the ``slow`` lane.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import tool_call
from test_executor import alive, comparable, executor_children
from test_rollout import PARAMS, SCRIPT, make_args, new_sample

from benchmarks.devserver_runners import DevServerThread
from strands_slime import generate
from strands_slime.cli import RolloutOptions, run_rollout
from strands_slime.config import get_rollout_config
from strands_slime.rollout import executor
from strands_slime.rollout.executor import shutdown_executors
from strands_slime.rollout.slime_compat import Sample
from strands_slime.runtime import get_runtime

ONE_WORKER = {"tools": [], "executor": {"workers": 1, "oversubscribe": True}}
DATA_DIR = Path(__file__).resolve().parents[1] / "strands_slime" / "data"


@pytest.fixture(scope="module")
def server() -> Iterator[DevServerThread]:
    with DevServerThread("scripted", script=SCRIPT) as running:
        yield running


def one_worker_args(url: str) -> Any:
    args = make_args(url)
    args.strands_slime = ONE_WORKER
    return args


async def one_episode(url: str) -> list[int]:
    """Run one episode through a worker; the worker PIDs of the executor that ran it."""
    args = one_worker_args(url)
    sample = await generate(args, new_sample("plain question"), dict(PARAMS))
    assert sample.status == Sample.Status.COMPLETED, sample.metadata
    running = await executor.get_executor(args, get_rollout_config(args))
    assert len(running.worker_pids) == 1 and set(running.worker_pids) <= executor_children()
    return running.worker_pids


@pytest.mark.slow
async def test_runtime_close_stops_the_workers(server: DevServerThread) -> None:
    pids = await one_episode(server.url)
    assert any(get_runtime().executors.values())
    await get_runtime().close()
    assert not any(alive(pid) for pid in pids), "close() returns once the workers have exited"
    assert not get_runtime().executors


@pytest.mark.slow
def test_reset_closes_the_workers_of_an_idle_loop(server: DevServerThread) -> None:
    """A module-scoped test loop between tests: the executor is closed on its own loop."""
    loop = asyncio.new_event_loop()
    try:
        pids = loop.run_until_complete(one_episode(server.url))
        get_runtime().reset()
        assert not any(alive(pid) for pid in pids), "reset() returns once the workers have exited"
        assert not get_runtime().executors
    finally:
        loop.close()


@pytest.mark.slow
def test_reset_kills_the_workers_of_a_loop_busy_in_another_thread(server: DevServerThread) -> None:
    """slime's rollout loop runs in its own thread; a reset from another thread (interpreter exit)
    kills its workers and waits, bounded, until they are gone."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        pids = asyncio.run_coroutine_threadsafe(one_episode(server.url), loop).result(timeout=300)
        get_runtime().reset()
        assert not any(alive(pid) for pid in pids), "reset() returns once the workers have exited"
        assert not get_runtime().executors
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


@pytest.mark.slow
async def test_offline_cli_stops_its_workers_after_sigint_and_at_the_end(tmp_path: Path) -> None:
    """``strands-slime rollout`` with workers: SIGINT keeps the finished samples and leaves no worker;
    ``--resume`` runs the rest through new workers and leaves none either."""
    config = tmp_path / "rollout.yaml"
    config.write_text("strands_slime:\n  executor:\n    workers: 1\n    oversubscribe: true\n")
    samples = tmp_path / "out" / "samples.jsonl"
    with DevServerThread("scripted", script=DATA_DIR / "demo_script.json", latency=0.3) as server:
        options = RolloutOptions(
            data=DATA_DIR / "demo_problems.jsonl",
            out=tmp_path / "out",
            base_url=server.url,
            config=config,
            n_samples=4,
            concurrency=2,
            quiet=True,
        )
        run = asyncio.ensure_future(run_rollout(options))
        seen_workers: set[int] = set()
        deadline = time.monotonic() + 120
        while not (samples.exists() and len(samples.read_text().splitlines()) >= 2):
            assert time.monotonic() < deadline and not run.done(), "2 samples within 120 s"
            seen_workers |= executor_children()
            await asyncio.sleep(0.05)
        assert seen_workers, "the episodes ran in a worker process"
        os.kill(os.getpid(), signal.SIGINT)
        summary = await asyncio.wait_for(run, 60)
        assert summary["interrupted"] == "SIGINT"
        assert not executor_children(), "no worker outlives the interrupted run"
        assert not any(alive(pid) for pid in seen_workers)
        kept = [json.loads(line) for line in samples.read_text().splitlines()]
        assert 2 <= len(kept) < 20

        options.resume = True
        summary = await run_rollout(options)
        assert summary["interrupted"] is None and summary["samples"] == 20
        assert not executor_children(), "no worker outlives a finished run"
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert records[: len(kept)] == kept
    assert sorted((r["group_index"], r["sample_index"]) for r in records) == [
        (g, k) for g in range(5) for k in range(4)
    ]
    assert all(r["status"] == "completed" for r in records)


FANOUT_SCRIPT = [
    {"match": "<tool_response>\n2\n", "replies": ["Done.\n\nAnswer: \\boxed{6}"]},
    {"match": "<tool_response>\n1\n", "replies": [tool_call("print(2)")]},
    {"match": "FANOUTQ", "replies": [tool_call("print(1)")]},
    {"match": "PLAINQ", "replies": ["Answer: \\boxed{5}"]},
]
FANOUT = {"sandbox": {"timeout_s": 5.0}, "fanout": {"enabled": True, "window_messages": 3}}


@pytest.mark.slow
async def test_fanout_through_workers_equals_in_process() -> None:
    """One sample per context segment: the same segments, tokens, masks, logprobs, rollout ids and
    metadata from a worker as in-process (timings aside)."""
    questions = [("FANOUTQ", "6", 7), ("PLAINQ", "5", 8)]
    with DevServerThread("scripted", script=FANOUT_SCRIPT) as server:
        results: dict[str, list[list[Sample]]] = {}
        for name, config in (
            ("in-process", FANOUT),
            ("workers", {**FANOUT, "executor": {"workers": 1, "oversubscribe": True}}),
        ):
            args = make_args(server.url)
            args.strands_slime = config
            results[name] = []
            for question, label, index in questions:
                sample = new_sample(question, label)
                sample.index = index
                result = await generate(args, sample, dict(PARAMS))
                assert isinstance(result, list) and result[0] is sample
                results[name].append(result)
        await shutdown_executors()  # on this test's loop, before it closes
    local, remote = results["in-process"], results["workers"]
    assert [len(episode) for episode in remote] == [2, 1], "FANOUTQ is compacted once"
    for local_episode, remote_episode in zip(local, remote, strict=True):
        assert [comparable(s) for s in remote_episode] == [comparable(s) for s in local_episode]
    fanned = remote[0]
    assert [s.rollout_id for s in fanned] == [7, 7]
    assert [(s.metadata["fanout_segment"], s.metadata["fanout_segments"]) for s in fanned] == [(0, 2), (1, 2)]
    assert all(s.status == Sample.Status.COMPLETED for episode in remote for s in episode)
    assert fanned[0] is not fanned[1] and len(fanned[1].tokens) - fanned[1].response_length < len(
        fanned[0].tokens
    ), "the second segment starts from the compacted context"
