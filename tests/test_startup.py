"""Start-up without loop stalls: the episode gate, one-time loads, and the start-up benchmark."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from strands_slime.aborts import AbortedError
from strands_slime.rollout import startup

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH = REPO_ROOT / "benchmarks" / "bench_startup.py"


def busy(seconds: float) -> None:
    """Synchronous work on the loop's thread (what an episode's set-up is)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def max_iteration_cpu(work: Any) -> tuple[float, Any]:
    """Run ``work`` while measuring the largest CPU time of this thread between two watchdog wakes."""
    longest = 0.0
    done = False
    watching = False

    async def watch() -> None:
        nonlocal longest, watching
        last = time.thread_time()
        watching = True
        while not done:
            await asyncio.sleep(0.001)
            now = time.thread_time()
            longest = max(longest, now - last)
            last = now

    watcher = asyncio.create_task(watch())
    await wait_until(lambda: watching, what="the watchdog to start")
    try:
        result = await work
    finally:
        done = True
        await watcher
    return longest, result


async def test_gate_spreads_simultaneous_set_ups_over_iterations() -> None:
    """400 episodes with 1 ms of set-up each, started at once: 400 ms of work, no iteration over 50 ms."""
    admitted: list[int] = []

    async def episode(index: int) -> None:
        await startup.episode_turn()
        admitted.append(index)
        busy(0.001)

    longest, _ = await max_iteration_cpu(asyncio.gather(*(episode(i) for i in range(400))))
    assert sorted(admitted) == list(range(400))
    assert admitted[:50] == list(range(50)), "episodes are admitted in arrival order"
    assert longest < 0.05, f"an iteration took {longest * 1000:.1f} ms of CPU"


async def test_gate_does_not_carry_a_cheap_burst_s_cost_into_the_next_burst() -> None:
    """Aborted episodes cost next to nothing; the next burst's set-ups still go a few per iteration."""

    async def episode(cost_s: float) -> None:
        await startup.episode_turn()
        busy(cost_s)

    await asyncio.gather(*(episode(0.00002) for _ in range(400)))  # learns ~20 µs per set-up
    longest, _ = await max_iteration_cpu(asyncio.gather(*(episode(0.003) for _ in range(100))))
    assert longest < 0.05, f"an iteration took {longest * 1000:.1f} ms of CPU"


async def test_gate_is_free_when_idle_and_survives_cancelled_waiters() -> None:
    idle_turn = startup.episode_turn().__await__()
    with pytest.raises(StopIteration):  # an idle gate returns at once: the first step finishes it
        idle_turn.send(None)

    async def episode() -> None:
        await startup.episode_turn()
        busy(0.002)

    tasks = [asyncio.create_task(episode()) for _ in range(60)]
    await asyncio.sleep(0)
    for task in tasks[10:30]:
        task.cancel()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    assert sum(isinstance(r, asyncio.CancelledError) for r in results) >= 15
    assert sum(r is None for r in results) >= 40


async def test_load_once_runs_off_the_loop_once_and_retries_failures() -> None:
    calls: list[str] = []
    loop_thread = threading.get_ident()

    def load(name: str) -> str:
        calls.append(name)
        assert threading.get_ident() != loop_thread, "blocking loads run in a worker thread"
        time.sleep(0.05)
        return name.upper()

    results = await asyncio.gather(*(startup.load_once(("test-load", 1), load, "tok") for _ in range(50)))
    assert results == ["TOK"] * 50 and calls == ["tok"]
    assert await startup.load_once(("test-load", 1), load, "tok") == "TOK" and calls == ["tok"]

    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("disk hiccup")
        return "ok"

    with pytest.raises(OSError, match="disk hiccup"):
        await startup.load_once(("test-flaky", 1), flaky)
    assert await startup.load_once(("test-flaky", 1), flaky) == "ok" and len(attempts) == 2


async def test_once_per_loop_is_shared_and_its_wait_is_abortable() -> None:
    starts: list[int] = []
    release = asyncio.Event()

    async def warm_up() -> str:
        starts.append(1)
        await release.wait()
        return "ready"

    aborted = threading.Event()
    waiters = [
        asyncio.ensure_future(startup.once_per_loop(("test-warm", 1), warm_up, aborted.is_set))
        for _ in range(20)
    ]
    await wait_until(lambda: starts, what="the shared warm-up to start")
    aborted.set()
    set_at = time.monotonic()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert time.monotonic() - set_at < 0.5
    assert all(isinstance(r, AbortedError) for r in results)
    release.set()  # the shared start itself was not cancelled: a later caller gets its result
    assert await startup.once_per_loop(("test-warm", 1), warm_up) == "ready"
    assert starts == [1]


def run_benchmark(episodes: int, *extra: str) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, str(BENCH), "--episodes", str(episodes), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


GROSS_BLOCKING_MS = 150.0
"""The 50 ms goal is a benchmark's (``benchmarks/bench_startup.py``, docs/rollout.md: 28-43 ms here); a
loaded CI machine stretches a loop iteration's CPU past it (58 ms seen at load 12). This bound still
fails on the regression the gate exists for: 1,024 set-ups of ~0.5 ms in one iteration is ~500 ms."""


@pytest.mark.slow
def test_starting_1024_episodes_at_once_never_runs_their_set_ups_in_one_loop_iteration() -> None:
    """The benchmark in a fresh process (cold templates, sandbox, client)."""
    result = run_benchmark(1024)
    assert result["statuses"] == {"completed": 1024}
    assert result["max_loop_cpu_ms"] <= GROSS_BLOCKING_MS, result


GROSS_ABORT_S = 3.0
"""The one-second goal is the benchmark's (docs/rollout.md); 1.28 s was seen at load 5-15. This bound still
fails on what it guards against: episodes that wait out a request's timeout (5 s and more) after the abort."""


@pytest.mark.slow
def test_1024_hanging_episodes_return_within_a_second_of_the_abort() -> None:
    result = run_benchmark(1024, "--abort-after", "8")
    assert result["statuses"] == {"aborted": 1024}
    assert result["abort_to_return_s"] <= GROSS_ABORT_S, result
