"""The episode executor inside the package: the runtime owns it (closing or resetting the runtime
stops the worker processes), the offline CLI stops it at the end of a run and on SIGINT, and fan-out
runs through it.

Real worker processes against the dev server over loopback, through ``generate``; each test starts
at least one worker (seconds of CPU), so all are in the ``slow`` lane.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from test_executor import alive, executor_children
from test_rollout import PARAMS, SCRIPT, make_args, new_sample

from strands_slime import executor, generate
from strands_slime.config import get_rollout_config
from strands_slime.devserver import DevServerThread
from strands_slime.runtime import get_runtime
from strands_slime.slime_compat import Sample

ONE_WORKER = {"tools": [], "executor": {"workers": 1, "oversubscribe": True}}


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
