"""The episode executor: real worker processes, the real dev server over loopback, slime's abort flag.

The worker tests share one event loop and one executor (starting workers costs seconds of CPU), in the
order written: equality, aborts, a crashed worker, and the parent's death last.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from test_rollout import PARAMS, SCRIPT, check_invariants, make_args, new_sample

from strands_slime import generate
from strands_slime.config import ConfigError, get_rollout_config, parse_config
from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangClient
from strands_slime.rollout import episode as rollout
from strands_slime.rollout import executor, executor_worker
from strands_slime.rollout.slime_compat import Sample
from strands_slime.runtime import get_runtime

pytestmark = pytest.mark.unit

RUNTIME_KEPT_IN_MODULE = ("executors",)
"""The worker tests share one executor; the ``server`` fixture closes the runtime at the module's end."""
WORKERS = 2
CONFIG = {"sandbox": {"timeout_s": 2.0}, "executor": {"workers": WORKERS, "oversubscribe": True}}
IN_PROCESS = {"sandbox": {"timeout_s": 2.0}}
QUESTIONS = ["What is seventeen times two?", "keep looping", "malformed call", "plain question"]
TIMING_KEYS = {"generate_seconds", "turn_seconds", "sandbox_seconds", "cached_tokens"}


async def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


# ---------------------------------------------------------------------- misconfiguration (no workers)


def test_workers_below_one_is_one_config_line() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"executor": {"workers": 0}})
    assert "executor.workers" in str(caught.value) and "\n" not in str(caught.value)


async def test_more_workers_than_cores_needs_opt_in() -> None:
    args = make_args("http://127.0.0.1:9")
    args.strands_slime = {"executor": {"workers": executor.usable_cores() + 1}}
    with pytest.raises(ConfigError, match=r"more than the \d+ CPU cores.*oversubscribe: true"):
        await generate(args, new_sample("plain"), dict(PARAMS))
    assert not any(get_runtime().executors.values()), "nothing was started"


async def test_unpicklable_args_field_fails_at_start() -> None:
    args = make_args("http://127.0.0.1:9", reward_key=threading.Lock())
    args.strands_slime = {"executor": {"workers": 1}}
    with pytest.raises(ConfigError, match=r"args\.reward_key \(lock\) cannot be sent to a worker process"):
        await generate(args, new_sample("plain"), dict(PARAMS))
    assert not any(get_runtime().executors.values())


def test_ray_settings_are_validated_in_one_line() -> None:
    for settings, expected in [
        ({"backend": "ray"}, "backend: ray needs workers"),
        ({"resources": {"CPU": 1}}, "resources only apply with backend: ray"),
        ({"backend": "ray", "workers": 1, "resources": {"GPU": 1}}, "GPU is refused"),
        ({"backend": "ray", "workers": 1, "resources": {"CPU": -1}}, "finite amount >= 0"),
        ({"backend": "ray", "workers": 1, "oversubscribe": True}, "oversubscribe only applies"),
        ({"backend": "spark", "workers": 1}, "executor.backend"),
    ]:
        with pytest.raises(ConfigError) as caught:
            parse_config({"executor": settings})
        assert expected in str(caught.value) and "\n" not in str(caught.value), (settings, caught.value)
    config = parse_config({"executor": {"backend": "ray", "workers": 2}})
    assert config.executor.resources == {"CPU": 1.0} and config.executor.strategy == "SPREAD"
    with pytest.raises(ConfigError, match="ray_actors only apply with backend: ray"):
        parse_config({"sandbox": {"ray_actors": 4}})


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"tools": [], "executor": {"backend": "ray", "workers": 1}},
            "executor.backend: ray needs the ray package",
        ),
        ({"sandbox": {"backend": "ray"}}, "sandbox.backend: ray needs the ray package"),
    ],
    ids=["executor", "sandbox"],
)
async def test_ray_backends_without_ray_are_one_config_line(
    monkeypatch: pytest.MonkeyPatch, config: dict[str, Any], expected: str
) -> None:
    """Where ray is not installed (the Python 3.10 lane; simulated here): the first generate stops the job."""
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without the package gives
    args = make_args("http://127.0.0.1:9")
    args.strands_slime = config
    with pytest.raises(ConfigError) as caught:
        await generate(args, new_sample("plain"), dict(PARAMS))
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value)
    assert not any(get_runtime().executors.values()), "nothing was started"


def executor_children() -> set[int]:
    """Live child processes of this test process that run the executor's worker."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"strands_slime.rollout.executor" in command and alive(int(entry)):
            found.add(int(entry))
    return found


@pytest.mark.slow
async def test_a_worker_that_cannot_start_is_one_config_line_and_leaves_no_process() -> None:
    before = executor_children()
    args = make_args("http://127.0.0.1:9")
    args.strands_slime = {"tools": [], "tokenizer_path": "/nonexistent/tokenizer", "executor": {"workers": 1}}
    with pytest.raises(ConfigError) as caught:
        await generate(args, new_sample("plain"), dict(PARAMS))
    message = str(caught.value)
    assert message.startswith("cannot load the tokenizer") and "\n" not in message, message
    await wait_until(lambda: executor_children() <= before, 10, "the failed worker to exit")


def test_result_fields_are_plain_and_cheap() -> None:
    """What crosses back is the fields generate writes, in plain types: a few bytes per token."""
    sample = Sample(prompt="p", tokens=list(range(150_000, 150_000 + 4000)), response_length=3000)
    sample.loss_mask = [1] * 3000
    sample.rollout_log_probs = [-0.5] * 3000
    sample.status = Sample.Status.COMPLETED
    sample.metadata = {"turns": 3}
    packed = executor_worker.pack_result(sample)
    assert set(packed) <= set(rollout.SAMPLE_RESULT_FIELDS) | set(executor.OPTIONAL_SAMPLE_ATTRIBUTES)
    assert packed["status"] == "COMPLETED" and packed["spec_info"] == Sample.SpecInfo().__dict__
    size = len(pickle.dumps(packed, protocol=5))
    assert size < 4000 * 5 + 3000 * 11 + 1000, size
    target = Sample(prompt="p")
    executor.apply_result(target, pickle.loads(pickle.dumps(packed, protocol=5)))
    assert target.tokens == sample.tokens and target.status is Sample.Status.COMPLETED
    assert isinstance(target.spec_info, Sample.SpecInfo)


# ---------------------------------------------------------------------- real workers

pytestmark_workers = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[DevServer]:
    async with DevServer(backend="scripted", script=SCRIPT) as running:
        yield running
        await get_runtime().close()


START_UP: dict[str, float] = {}


async def loop_cpu_ticker(into: list[float]) -> None:
    """CPU of this loop's thread between two 2 ms wakes: what one loop iteration cost."""
    cpu = time.thread_time()
    while True:
        await asyncio.sleep(0.002)
        now = time.thread_time()
        into.append(now - cpu)
        cpu = now


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def workers(server: DevServer) -> executor.EpisodeExecutor:
    """The shared executor, started before any test's deadlines run (start-up takes seconds of CPU);
    the loop's longest iteration during the start is kept for the test below."""
    iterations: list[float] = []
    ticker = asyncio.ensure_future(loop_cpu_ticker(iterations))
    try:
        running = await executor.get_executor(
            worker_args(server.url), get_rollout_config(worker_args(server.url))
        )
    finally:
        ticker.cancel()
    START_UP["max_loop_cpu_s"] = max(iterations)
    START_UP["wakes"] = len(iterations)
    return running


@pytest.mark.slow
@pytestmark_workers
async def test_workers_start_off_the_event_loop(workers: executor.EpisodeExecutor) -> None:
    """Starting the workers (imports, tokenizer, sandbox: seconds of CPU) never holds slime's loop."""
    assert START_UP["wakes"] > 10
    assert START_UP["max_loop_cpu_s"] < 0.05, START_UP


def worker_args(url: str, **overrides: Any) -> Any:
    args = make_args(url, **overrides)
    args.strands_slime = CONFIG
    return args


def comparable(sample: Sample) -> dict[str, Any]:
    fields = {name: getattr(sample, name) for name in rollout.SAMPLE_RESULT_FIELDS}
    fields["metadata"] = {k: v for k, v in sample.metadata.items() if k not in TIMING_KEYS}
    fields["prefix_cache_info"] = sample.prefix_cache_info.total_prompt_tokens
    fields.pop("non_generation_time")
    return fields


@pytest.mark.slow
@pytestmark_workers
async def test_workers_give_the_in_process_result(
    server: DevServer, workers: executor.EpisodeExecutor
) -> None:
    local = [new_sample(q) for q in QUESTIONS]
    for sample in local:
        await generate(make_args(server.url, strands_slime=IN_PROCESS), sample, dict(PARAMS))
    remote = [new_sample(q) for q in QUESTIONS]
    results = await asyncio.gather(
        *(generate(worker_args(server.url), sample, dict(PARAMS)) for sample in remote)
    )
    assert [r is s for r, s in zip(results, remote, strict=True)] == [True] * len(remote)
    statuses = [s.status for s in remote]
    assert statuses == [
        Sample.Status.COMPLETED,
        Sample.Status.TRUNCATED,
        Sample.Status.COMPLETED,
        Sample.Status.COMPLETED,
    ]
    for a, b in zip(local, remote, strict=True):
        check_invariants(b)
        assert comparable(a) == comparable(b)
    running = await executor.get_executor(
        worker_args(server.url), get_rollout_config(worker_args(server.url))
    )
    assert len(running.worker_pids) == WORKERS and os.getpid() not in running.worker_pids
    assert running.stats.episodes >= len(QUESTIONS)
    per_episode = running.stats.bytes_received / running.stats.episodes
    assert per_episode < 64_000, per_episode


@pytest.mark.slow
@pytestmark_workers
async def test_abort_reaches_workers_within_100_ms_and_nothing_is_sent_after(
    server: DevServer, workers: executor.EpisodeExecutor
) -> None:
    await abort_reaches_every_worker(server, workers, worker_args, WORKERS)


async def abort_reaches_every_worker(
    server: DevServer, running: executor.EpisodeExecutor, args_for: Callable[..., Any], size: int
) -> None:
    """8 episodes waiting on the server, slime's flag set: every worker's flag within 100 ms, every
    episode ABORTED within 1 s, no request after it; then an episode dispatched after the abort sends
    nothing, and one after the reset completes (also run through Ray actors, test_executor_ray.py)."""
    aborted = threading.Event()
    args = args_for(server.url, abort_event=aborted)
    before = len(server.request_log)
    server.scheduler.latency = 600.0  # the server never answers
    try:
        tasks = [asyncio.ensure_future(generate(args, new_sample("plain"), dict(PARAMS))) for _ in range(8)]
        await wait_until(lambda: len(server.request_log) >= before + 8, 30, "8 requests at the server")
        seen = len(running.stats.abort_seen_at)
        set_at = time.monotonic()
        aborted.set()
        samples = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        returned = time.monotonic() - set_at
    finally:
        server.scheduler.latency = 0.0
    assert all(s.status == Sample.Status.ABORTED for s in samples)
    assert all(s.metadata["abort_source"] == "slime" and not s.remove_sample for s in samples)
    for sample in samples:
        check_invariants(sample)
    # a Ray actor's acknowledgment is its own call's reply: it may come after the episodes' replies
    await wait_until(lambda: len(running.stats.abort_seen_at) >= seen + size, 30, "every worker's ack")
    propagation = [t - set_at for t in running.stats.abort_seen_at[seen:]]
    assert len(propagation) == size, "every worker acknowledged the abort once"
    assert max(propagation) < 0.1, propagation
    assert returned < 1.0, returned
    assert len(server.request_log) == before + 8, "no request after the abort"
    # aborted before dispatch: the worker never sends the request
    sample = await generate(args, new_sample("plain"), dict(PARAMS))
    assert sample.status == Sample.Status.ABORTED and len(server.request_log) == before + 8
    # slime resets its flag for the next rollout: episodes run again
    aborted.clear()
    sample = await generate(args, new_sample("plain"), dict(PARAMS))
    assert sample.status == Sample.Status.COMPLETED


@pytest.mark.slow
@pytestmark_workers
async def test_a_server_abort_makes_the_sample_aborted(
    server: DevServer, workers: executor.EpisodeExecutor
) -> None:
    args = worker_args(server.url, abort_event=threading.Event())
    before = len(server.request_log)
    server.scheduler.token_latency = 0.05  # a long reply, token by token: the abort lands mid-reply
    try:
        task = asyncio.ensure_future(generate(args, new_sample("slowpoke"), dict(PARAMS)))
        await wait_until(lambda: len(server.request_log) > before, 30, "the request at the server")
        async with SGLangClient(server.url) as client:
            await client.abort(abort_all=True)
        sample = await asyncio.wait_for(task, 10)
    finally:
        server.scheduler.token_latency = 0.0
    assert sample.status == Sample.Status.ABORTED and sample.metadata["abort_source"] == "server"
    check_invariants(sample)


@pytest.mark.slow
@pytestmark_workers
async def test_a_crashed_worker_fails_its_episodes_and_is_replaced(
    server: DevServer, workers: executor.EpisodeExecutor
) -> None:
    def kill() -> int:
        pid = workers.worker_pids[0]
        os.kill(pid, signal.SIGKILL)
        return pid

    failed, victim = await one_worker_dies(server, workers, worker_args, WORKERS, kill)
    for sample in failed:
        reason = sample.metadata["infra_error"]
        assert f"(pid {victim}) died (killed by SIGKILL)" in reason, reason
    assert victim not in workers.worker_pids and workers.stats.worker_crashes >= 1


async def one_worker_dies(
    server: DevServer,
    running: executor.EpisodeExecutor,
    args_for: Callable[..., Any],
    size: int,
    kill: Callable[[], Any],
) -> tuple[list[Sample], Any]:
    """4 episodes waiting on the server (2 per worker of 2); ``kill()`` ends one worker and names it.
    Exactly that worker's episodes come back at once, FAILED and removed (the others are aborted
    after); a replacement starts and episodes complete again. Returns the failed samples and the
    name (also run through Ray actors, test_executor_ray.py)."""
    started, dispatched = running.stats.workers_started, running.stats.episodes
    aborted = threading.Event()
    args = args_for(server.url, abort_event=aborted)
    before = len(server.request_log)
    server.scheduler.latency = 600.0
    try:
        tasks = [asyncio.ensure_future(generate(args, new_sample("plain"), dict(PARAMS))) for _ in range(4)]
        await wait_until(lambda: len(server.request_log) >= before + 4, 30, "4 requests at the server")
        assert running.stats.episodes >= dispatched + 4, "the shared executor runs them"
        victim = kill()
        await wait_until(lambda: sum(t.done() for t in tasks) >= 2, 30, "the dead worker's episodes")
        failed = [t.result() for t in tasks if t.done()]
        aborted.set()
        rest = await asyncio.wait_for(asyncio.gather(*(t for t in tasks if not t.done())), 10)
    finally:
        server.scheduler.latency = 0.0
    assert len(failed) == 2 and len(rest) == 2, "exactly the dead worker's episodes failed"
    for sample in failed:
        assert sample.status == Sample.Status.FAILED and sample.remove_sample
        check_invariants(sample)
    assert all(s.status == Sample.Status.ABORTED for s in rest)
    await wait_until(
        lambda: running.stats.workers_started == started + 1 and len(running.worker_pids) == size,
        120,
        "the replacement worker",
    )
    results = await asyncio.gather(
        *(generate(args_for(server.url), new_sample("plain"), dict(PARAMS)) for _ in range(4))
    )
    assert all(s.status == Sample.Status.COMPLETED for s in results)
    return failed, victim


PARENT = textwrap.dedent(
    """
    import asyncio, sys
    from types import SimpleNamespace
    from strands_slime.config import parse_config
    from strands_slime.rollout.executor import get_executor

    async def main():
        host, port = sys.argv[1].removeprefix("http://").rsplit(":", 1)
        args = SimpleNamespace(sglang_router_ip=host, sglang_router_port=int(port), hf_checkpoint=None)
        config = parse_config({"executor": {"workers": 2, "oversubscribe": True}})
        running = await get_executor(args, config)
        print(" ".join(map(str, running.worker_pids)), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytestmark_workers
async def test_workers_die_with_their_parent(server: DevServer) -> None:
    parent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PARENT,
        server.url,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert parent.stdout is not None
    line = await asyncio.wait_for(parent.stdout.readline(), 120)
    pids = [int(pid) for pid in line.split()]
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    parent.kill()
    await parent.wait()
    await wait_until(lambda: not any(alive(pid) for pid in pids), 10, "the workers to exit")


async def test_a_wait_added_while_the_abort_poller_unwinds_is_still_watched() -> None:
    """Found through the workers: one request's wait ends (the idle poller is cancelled) and the next
    wait starts in the same step, before the cancelled poller has unwound; it must still be aborted."""
    from strands_slime.aborts import AbortedError, run_abortable

    flag = threading.Event()
    second_wait_started = asyncio.Event()

    async def long_wait() -> None:
        second_wait_started.set()
        await asyncio.sleep(30)

    async def two_waits() -> None:
        await run_abortable(asyncio.sleep(0), flag.is_set)
        await run_abortable(long_wait(), flag.is_set)

    episode = asyncio.ensure_future(two_waits())
    await asyncio.wait_for(second_wait_started.wait(), 10)
    flag.set()
    with pytest.raises(AbortedError):
        await asyncio.wait_for(episode, 2)
