"""The executor's Ray backend and the sandbox's Ray actor pool on a real multi-node Ray cluster on this
machine (``tests/ray_cluster.py``: a head and two nodes, 2 CPUs each), the scripted dev server over
loopback, the real tokenizer and sandbox in the actors.

In the order written: misconfiguration; slime's own rollout code (over-sampling, its abort,
``--partial-rollout`` and the resume of the recycled samples) through one actor; then one executor of 2
actors shared by the next tests (an actor's start-up costs seconds of CPU): placement and results, aborts,
a killed actor, a lost node (the cluster keeps one node fewer from there on); the sandbox's pool last.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
import slime_harness
from ray_cluster import (  # noqa: F401  (the module's cluster fixture)
    EPISODE_RESOURCE,
    ROLLOUT_LABEL,
    SANDBOX_RESOURCE,
    node_of,
    node_processes,
    ray_cluster,
)
from test_executor import IN_PROCESS, QUESTIONS, abort_reaches_every_worker, comparable, one_worker_dies
from test_executor_slime import over_sampling_abort_and_partial_rollout
from test_rollout import PARAMS, SCRIPT, check_invariants, make_args, new_sample
from test_slime_integration import SCRIPT as SLIME_SCRIPT
from test_slime_integration import WITH_TOOLS
from waiting import wait_until

from strands_slime import generate
from strands_slime.config import ConfigError, get_rollout_config
from strands_slime.devserver import DevServer
from strands_slime.rollout import executor
from strands_slime.rollout.executor_ray import HEARTBEATS_PER_DEADLINE
from strands_slime.rollout.slime_compat import Sample
from strands_slime.runtime import get_runtime
from strands_slime.sandbox import Sandbox, SandboxConfig
from strands_slime.sandbox.result import ResultKind

ray = pytest.importorskip("ray", reason="ray (a [dev] test dependency) runs the Ray backends")

pytestmark = pytest.mark.slow

RUNTIME_KEPT_IN_MODULE = ("executors",)
"""The executor tests share one executor; the ``server`` fixture closes the runtime at the module's end."""
WORKERS = 2
ACTOR_TIMEOUT_S = 10
"""Twice the default: a node of this 2-core test cluster may be starved for seconds while the other test
worker runs (an actor declared hung at 5.9 s in CI); the frozen node still fails long before Ray's minute."""
CONFIG = {
    "sandbox": {"timeout_s": 2.0},
    "executor": {
        "backend": "ray",
        "workers": WORKERS,
        "resources": {"CPU": 1, EPISODE_RESOURCE: 1},
        "actor_timeout_s": ACTOR_TIMEOUT_S,
    },
}
"""One actor per node (each node has one ``episode_slot``): a lost node takes exactly one actor, and a
replacement goes to a node without one."""
shared_loop = pytest.mark.asyncio(loop_scope="module")


# ---------------------------------------------------------------------- misconfiguration

NOT_CONNECTED = textwrap.dedent(
    """
    import asyncio, sys
    from test_rollout import PARAMS, make_args, new_sample
    from strands_slime import generate
    from strands_slime.config import ConfigError

    async def main():
        args = make_args("http://127.0.0.1:9")
        args.strands_slime = {"executor": {"backend": "ray", "workers": 1}}
        try:
            await generate(args, new_sample("plain"), dict(PARAMS))
        except ConfigError as exc:
            print("ConfigError:", exc)

    asyncio.run(main())
    """
)


def test_a_process_not_connected_to_ray_is_one_config_line() -> None:
    """A fresh process (as slime's would be outside Ray): the first generate says what is missing."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.path.join(os.getcwd(), "tests")])}
    done = subprocess.run(
        [sys.executable, "-c", NOT_CONNECTED], capture_output=True, text=True, timeout=120, env=env
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("ConfigError:")]
    assert len(lines) == 1, (done.stdout, done.stderr[-2000:])
    assert "not connected to a Ray cluster" in lines[0] and "executor.address" in lines[0]


@shared_loop
async def test_too_few_cpus_and_an_unknown_resource_are_one_config_line(ray_cluster: Any) -> None:  # noqa: F811
    args = make_args("http://127.0.0.1:9")
    args.strands_slime = {"executor": {"backend": "ray", "workers": 50}}
    with pytest.raises(ConfigError) as caught:
        await generate(args, new_sample("plain"), dict(PARAMS))
    message = str(caught.value)
    assert "executor.workers=50 episode actors of {CPU: 1} do not fit" in message and "\n" not in message
    assert "room for 6 (" in message and message.count(": room for 2 (CPU 2 free)") == 3, "node by node"
    args.strands_slime = {"executor": {"backend": "ray", "workers": 1, "resources": {"rollout_cpu": 1}}}
    with pytest.raises(ConfigError, match=r"no node of the Ray cluster has the resource 'rollout_cpu'"):
        await generate(args, new_sample("plain"), dict(PARAMS))
    assert not any(get_runtime().executors.values()), "nothing was started"


# ---------------------------------------------------------------------- slime's own rollout code


async def test_slime_rollout_abort_and_partial_rollout_through_a_ray_actor(
    ray_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    slime_harness.load_slime()
    slime_harness.reset_slime_state()
    custom = {"strands_slime": {**WITH_TOOLS["strands_slime"], "executor": {"backend": "ray", "workers": 1}}}
    try:
        async with DevServer("scripted", script=SLIME_SCRIPT) as engine:
            try:
                await over_sampling_abort_and_partial_rollout(engine, tmp_path, custom)
            finally:
                await executor.shutdown_executors()
    finally:
        slime_harness.reset_slime_state()


# ---------------------------------------------------------------------- one shared executor


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[DevServer]:
    async with DevServer(backend="scripted", script=SCRIPT) as running:
        yield running
        await get_runtime().close()


def ray_args(url: str, **overrides: Any) -> Any:
    args = make_args(url, **overrides)
    args.strands_slime = CONFIG
    return args


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def actors(server: DevServer, ray_cluster: Any) -> executor.EpisodeExecutor:  # noqa: F811
    args = ray_args(server.url)
    return await executor.get_executor(args, get_rollout_config(args))


@shared_loop
async def test_actors_spread_over_nodes_and_give_the_in_process_result(
    server: DevServer, actors: executor.EpisodeExecutor
) -> None:
    assert len(set(actors.worker_nodes)) == WORKERS, "one actor per node"
    assert os.getpid() not in actors.worker_pids
    local = [new_sample(q) for q in QUESTIONS]
    for sample in local:
        await generate(make_args(server.url, strands_slime=IN_PROCESS), sample, dict(PARAMS))
    remote = [new_sample(q) for q in QUESTIONS]
    results = await asyncio.gather(*(generate(ray_args(server.url), s, dict(PARAMS)) for s in remote))
    assert [r is s for r, s in zip(results, remote, strict=True)] == [True] * len(remote)
    for a, b in zip(local, remote, strict=True):
        check_invariants(b)
        assert comparable(a) == comparable(b)
    assert remote[0].metadata["tool_calls"] == 1, "the sandbox ran in the actor"
    assert actors.stats.episodes >= len(QUESTIONS)


@shared_loop
async def test_several_agents_in_a_ray_actor_equal_in_process(ray_cluster: Any) -> None:  # noqa: F811
    """A multi-agent episode (a verifier sub-agent with a nested checker) run in a Ray actor returns the
    samples the in-process episode returns: one per agent, same ids, masks, logprobs and metadata."""
    from test_multi_agent import CHECKER, OPTIONS, VERIFIER, same_across_runs
    from test_multi_agent import SCRIPT as AGENTS_SCRIPT
    from test_multi_agent import make_args as agent_args
    from test_multi_agent import new_sample as agent_sample

    from strands_slime.rollout.offline import sampling_params

    # its own actor, off the module's episode slots (one per node, held by the shared executor)
    ray_executor = {"executor": {"backend": "ray", "workers": 1, "resources": {"CPU": 0.5}}}
    results = []
    async with DevServer("scripted", script=AGENTS_SCRIPT) as dev:
        for placement in ({}, ray_executor):
            args = agent_args(dev.url, {"subagents": [VERIFIER, CHECKER]})
            args.strands_slime.update(placement)
            results.append(await generate(args, agent_sample("Solve NESTED: 2+2"), sampling_params(OPTIONS)))
        running = await executor.get_executor(args, get_rollout_config(args))
        assert running.worker_pids and os.getpid() not in running.worker_pids, "it ran in an actor"
        await running.close()
    local, remote = results
    assert [s.metadata["agent"] for s in remote] == ["main", "verifier", "checker"]
    assert [same_across_runs(s) for s in remote] == [same_across_runs(s) for s in local]


@shared_loop
async def test_abort_reaches_every_actor_within_100_ms_and_nothing_is_sent_after(
    server: DevServer, actors: executor.EpisodeExecutor
) -> None:
    await abort_reaches_every_worker(server, actors, ray_args, WORKERS)


# ---------------------------------------------------------------------- the executor inside slime's actor


def rollout_manager_like() -> type:
    """A class shaped like slime's ``RolloutManager``: a threaded Ray actor whose rollout runs an event
    loop in a thread of its own and calls ``generate`` there. Made here, so Ray ships it by value (the
    actor's process cannot import this test module)."""

    class RolloutManagerLike:
        def __init__(self, tests_dir: str) -> None:
            sys.path.insert(0, tests_dir)

        def rollout(self, url: str, label: dict[str, str]) -> dict[str, Any]:
            result: dict[str, Any] = {}

            def run() -> None:
                from test_rollout import PARAMS, make_args, new_sample

                async def main() -> None:
                    args = make_args(url)
                    args.strands_slime = {
                        "sandbox": {"timeout_s": 2.0},
                        "executor": {"backend": "ray", "workers": 1, "placement": {"node_labels": label}},
                    }
                    samples = await asyncio.gather(
                        *(generate(args, new_sample("plain"), dict(PARAMS)) for _ in range(3))
                    )
                    running = executor.running_executor(args, get_rollout_config(args))
                    result["statuses"] = [s.status.name for s in samples]
                    result["nodes"] = running.worker_nodes if running is not None else []
                    await get_runtime().close()

                asyncio.run(main())

            thread = threading.Thread(target=run)
            thread.start()
            thread.join()
            return result

    return RolloutManagerLike


@shared_loop
async def test_the_executor_runs_inside_a_threaded_actor_on_the_labelled_nodes(
    server: DevServer,
    ray_cluster: Any,  # noqa: F811
) -> None:
    manager_class = ray.remote(num_cpus=0, max_concurrency=4)(rollout_manager_like())
    manager = manager_class.remote(str(Path(__file__).parent))
    try:
        result = await asyncio.wait_for(manager.rollout.remote(server.url, ROLLOUT_LABEL), 300)
    finally:
        ray.kill(manager)
    assert result["statuses"] == ["COMPLETED"] * 3, result
    labelled = {node.node_id for node in ray_cluster.worker_nodes}
    assert len(result["nodes"]) == 1 and set(result["nodes"]) <= labelled, (
        "pinned to a labelled node",
        result,
    )


# ---------------------------------------------------------------------- faults the actors survive


class LostCall:
    """An actor call that a brief network error lost: its result is Ray's ``ActorUnavailableError``."""

    def future(self) -> concurrent.futures.Future[Any]:
        lost: concurrent.futures.Future[Any] = concurrent.futures.Future()
        lost.set_exception(
            ray.exceptions.ActorUnavailableError(
                "injected: RPC error: Socket closed (the actor may be alive)", None
            )
        )
        return lost


class FaultyActor:
    """An actor handle whose next call of each named method is lost to a transient RPC error (the
    fault at the actor boundary); every other call goes to the real actor."""

    def __init__(self, actor: Any, faults: set[str]) -> None:
        self._actor = actor
        self.faults = faults

    def __getattr__(self, name: str) -> Any:
        if name in self.faults:
            self.faults.discard(name)
            lost = SimpleNamespace(remote=lambda *args, **kwargs: LostCall())
            return SimpleNamespace(remote=lost.remote, options=lambda **options: lost)
        return getattr(self._actor, name)


@shared_loop
async def test_a_transient_rpc_error_fails_only_the_lost_episode_and_the_actor_lives_on(
    server: DevServer, actors: executor.EpisodeExecutor
) -> None:
    pids, started, crashes = (
        list(actors.worker_pids),
        actors.stats.workers_started,
        actors.stats.worker_crashes,
    )
    link = next(iter(actors._workers.values())).link  # the first actor's link: its next episode is lost
    faulty = link.actor = FaultyActor(link.actor, {"run", "ping"})
    try:
        samples = await asyncio.wait_for(
            asyncio.gather(
                *(generate(ray_args(server.url), new_sample("plain"), dict(PARAMS)) for _ in range(4))
            ),
            60,
        )
        await wait_until(lambda: not faulty.faults, timeout=30, what="a heartbeat lost too")
        await asyncio.sleep(link.timeout_s)  # a whole deadline with one heartbeat lost: not a death
    finally:
        link.actor = faulty._actor
    failed = [s for s in samples if s.status == Sample.Status.FAILED]
    assert len(failed) == 1 and sum(s.status == Sample.Status.COMPLETED for s in samples) == 3, samples
    assert (
        "its call was lost to a transient Ray error (ActorUnavailableError"
        in failed[0].metadata["infra_error"]
    )
    assert actors.worker_pids == pids, "no actor was declared dead"
    assert (actors.stats.workers_started, actors.stats.worker_crashes) == (started, crashes)


@shared_loop
async def test_a_stall_of_this_process_is_not_taken_for_a_silent_actor(
    server: DevServer, actors: executor.EpisodeExecutor
) -> None:
    """slime's loop blocked for longer than the deadline (a long GC pause, a CPU-starved driver): the
    actors answered every heartbeat that was sent, so none is declared dead when the loop runs again."""
    pids, started = list(actors.worker_pids), actors.stats.workers_started
    beat = ACTOR_TIMEOUT_S / HEARTBEATS_PER_DEADLINE
    await asyncio.sleep(beat)  # a heartbeat answered, none outstanding
    time.sleep(ACTOR_TIMEOUT_S * 1.3)  # noqa: ASYNC251 - the stall under test
    await asyncio.sleep(beat * 1.5)  # the heartbeat's next look at the silence
    samples = await asyncio.gather(
        *(generate(ray_args(server.url), new_sample("plain"), dict(PARAMS)) for _ in range(4))
    )
    assert all(s.status == Sample.Status.COMPLETED for s in samples), samples
    assert actors.worker_pids == pids and actors.stats.workers_started == started, "no actor declared dead"


@shared_loop
async def test_a_frozen_node_fails_its_episodes_at_the_deadline_and_an_abort_returns_the_rest(
    server: DevServer,
    actors: executor.EpisodeExecutor,
    ray_cluster: Any,  # noqa: F811
) -> None:
    """A node whose raylet and actor are stopped (SIGSTOP) answers nothing, as a hung or partitioned
    one: its episodes fail after executor.actor_timeout_s (here 10 s), whatever slime's abort does, not after
    the minute Ray takes to declare the node dead; the other actor's episodes are aborted at once."""
    head = ray_cluster.head_node.node_id
    victim = next(worker for worker in actors._workers.values() if worker.node_id != head)
    frozen = [victim.pid, *node_processes(node_of(ray_cluster, victim.node_id))]
    started = actors.stats.workers_started
    aborted = threading.Event()
    args = ray_args(server.url, abort_event=aborted)
    before = len(server.request_log)
    server.scheduler.latency = 600.0
    stopped: list[int] = []
    try:
        tasks = [asyncio.ensure_future(generate(args, new_sample("plain"), dict(PARAMS))) for _ in range(4)]
        await wait_until(
            lambda: len(server.request_log) >= before + 4, timeout=30, what="4 requests at the server"
        )
        assert len(victim.inflight) == 2, "2 episodes on each actor"
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        frozen_at = time.monotonic()
        aborted.set()
        samples = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        took = time.monotonic() - frozen_at
    finally:
        server.scheduler.latency = 0.0
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    failed = [s for s in samples if s.status == Sample.Status.FAILED]
    assert len(failed) == 2 and sum(s.status == Sample.Status.ABORTED for s in samples) == 2, samples
    for sample in failed:
        reason = sample.metadata["infra_error"]
        assert f"pid {victim.pid} on node" in reason and "answered no heartbeat and no abort for" in reason, (
            reason
        )
        assert f"(executor.actor_timeout_s={ACTOR_TIMEOUT_S})" in reason and "its node is hung" in reason, (
            reason
        )
    print(f"frozen node: its episodes failed {took:.1f} s after the freeze")
    aborted.clear()
    await wait_until(
        lambda: actors.stats.workers_started == started + 1 and len(actors.worker_pids) == WORKERS,
        timeout=120,
        what="the replacement actor",
    )
    results = await asyncio.gather(
        *(generate(ray_args(server.url), new_sample("plain"), dict(PARAMS)) for _ in range(4))
    )
    assert all(s.status == Sample.Status.COMPLETED for s in results)


# ---------------------------------------------------------------------- the sandbox's actor pool


@shared_loop
async def test_sandbox_calls_run_in_an_actor_pool_and_a_dead_actor_is_an_infra_result(
    ray_cluster: Any,  # noqa: F811
) -> None:
    resources = {"CPU": 0.5, SANDBOX_RESOURCE: 1}  # one per worker node: one actor on each
    config = SandboxConfig(backend="ray", ray_actors=2, ray_resources=resources, timeout_s=30)
    sandbox = Sandbox(config)
    await sandbox.start()
    try:
        placements = sandbox.placements
        workers = {node.node_id for node in ray_cluster.worker_nodes}
        assert len(placements) == 2 and {p.node_id for p in placements} == workers, "one per labelled node"
        assert os.getpid() not in {p.pid for p in placements}
        results = await asyncio.gather(*(sandbox.run("print(sum(range(10**5)))") for _ in range(4)))
        assert [r.stdout for r in results] == ["4999950000\n"] * 4 and all(r.ok for r in results)
        # two long calls, one per actor; one actor's process dies under its call
        calls = [asyncio.ensure_future(sandbox.run("import time; time.sleep(60)")) for _ in range(2)]
        await wait_until(lambda: all(p.calls for p in sandbox.placements), what="a call in each actor")
        os.kill(placements[0].pid, signal.SIGKILL)
        await wait_until(lambda: any(c.done() for c in calls), what="the dead actor's call")
        dead = next(c for c in calls if c.done()).result()
        assert dead.kind is ResultKind.INFRA and "sandbox actor died (Ray: its worker process has died)" in (
            dead.error or ""
        )
        other = next(c for c in calls if not c.done())
        other.cancel()  # an aborted tool call cancels the actor's call
        await asyncio.wait_for(asyncio.gather(other, return_exceptions=True), 2)
        await wait_until(
            lambda: (
                len(sandbox.placements) == 2 and placements[0].pid not in {p.pid for p in sandbox.placements}
            ),
            timeout=60,
            what="the replacement sandbox actor",
        )
        assert (await sandbox.run("print(6 * 7)")).stdout == "42\n"
        # an idle actor dies: the pool sees it (its watch call) and sends the next calls elsewhere
        idle = sandbox.placements[0].pid
        os.kill(idle, signal.SIGKILL)
        await wait_until(
            lambda: idle not in {p.pid for p in sandbox.placements}, timeout=30, what="the idle actor's death"
        )
        results = await asyncio.gather(*(sandbox.run("print(6 * 7)") for _ in range(4)))
        assert all(r.ok and r.stdout == "42\n" for r in results), results
    finally:
        await sandbox.close()


@shared_loop
async def test_a_sandbox_actor_that_stops_answering_is_bounded_and_same_node_pins_it_here(
    ray_cluster: Any,  # noqa: F811
) -> None:
    """``ray_same_node``: the pool of this process (on the head) is on the head. Its actor's process
    stopped (SIGSTOP: a hung node for the caller) turns the call into an INFRA result after the
    execution's timeout plus ANSWER_GRACE_S, not a wait without end; the actor is replaced."""
    from strands_slime.sandbox.ray_backend import ANSWER_GRACE_S

    config = SandboxConfig(
        backend="ray", ray_actors=1, ray_resources={"CPU": 0.5}, ray_same_node=True, timeout_s=2
    )
    sandbox = Sandbox(config)
    await sandbox.start()
    stopped: int | None = None
    try:
        (placement,) = sandbox.placements
        assert placement.node_id == ray.get_runtime_context().get_node_id() == ray_cluster.head_node.node_id
        os.kill(placement.pid, signal.SIGSTOP)
        stopped = placement.pid
        result = await asyncio.wait_for(sandbox.run("print(1)"), 60)
        assert result.kind is ResultKind.INFRA, result
        assert f"sandbox actor lost (no answer within {2 + ANSWER_GRACE_S:g} s" in (result.error or ""), (
            result
        )
        await wait_until(
            lambda: [p.pid for p in sandbox.placements] not in ([], [stopped]),
            timeout=60,
            what="a replacement",
        )
        assert (await sandbox.run("print(6 * 7)")).stdout == "42\n"
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        await sandbox.close()


# ---------------------------------------------------------------------- dead actors


@shared_loop
async def test_a_killed_actor_fails_exactly_its_episodes_and_is_replaced(
    server: DevServer, actors: executor.EpisodeExecutor
) -> None:
    def kill() -> int:
        pid = actors.worker_pids[0]
        os.kill(pid, signal.SIGKILL)  # the actor's process, on this machine's node
        return pid

    failed, victim = await one_worker_dies(server, actors, ray_args, WORKERS, kill)
    for sample in failed:
        reason = sample.metadata["infra_error"]
        assert reason.startswith("WorkerDied: executor worker") and "Ray actor" in reason, reason
        assert f"pid {victim} on node" in reason and "died (Ray: its worker process has died)" in reason
    assert victim not in actors.worker_pids and actors.stats.worker_crashes >= 1


@shared_loop
async def test_a_hard_node_kill_fails_exactly_its_episodes_as_a_dead_node_and_a_replacement_is_placed_elsewhere(
    server: DevServer,
    actors: executor.EpisodeExecutor,
    ray_cluster: Any,  # noqa: F811
) -> None:
    """Every process of a node SIGKILLed at once (a machine lost): its episodes fail as its node's death
    (within executor.actor_timeout_s, before Ray notices the node), not as a transient socket error."""
    head = ray_cluster.head_node.node_id

    def kill() -> str:
        victim = next(node for node in actors.worker_nodes if node != head)  # the head cannot go
        node = node_of(ray_cluster, victim)
        for pid in node_processes(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        ray_cluster.remove_node(node, allow_graceful=False)  # the rest of its processes, and the bookkeeping
        return victim

    failed, victim = await one_worker_dies(server, actors, ray_args, WORKERS, kill)
    for sample in failed:
        reason = sample.metadata["infra_error"]
        assert f"{victim[:8]}) died (Ray: its node has died" in reason, reason
    assert victim not in actors.worker_nodes and len(set(actors.worker_nodes)) >= 1
