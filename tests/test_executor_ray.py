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
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import slime_harness
from ray_cluster import EPISODE_RESOURCE, SANDBOX_RESOURCE, node_of, ray_cluster  # noqa: F401  (the module's cluster fixture)
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
from strands_slime.runtime import get_runtime
from strands_slime.sandbox import Sandbox, SandboxConfig
from strands_slime.sandbox.result import ResultKind

ray = pytest.importorskip("ray", reason="ray (a [dev] test dependency) runs the Ray backends")

pytestmark = pytest.mark.slow

RUNTIME_KEPT_IN_MODULE = ("executors",)
"""The executor tests share one executor; the ``server`` fixture closes the runtime at the module's end."""
WORKERS = 2
CONFIG = {
    "sandbox": {"timeout_s": 2.0},
    "executor": {"backend": "ray", "workers": WORKERS, "resources": {"CPU": 1, EPISODE_RESOURCE: 1}},
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
    assert "executor.workers=50 Ray actors" in message and "do not fit" in message and "\n" not in message
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
async def test_abort_reaches_every_actor_within_100_ms_and_nothing_is_sent_after(
    server: DevServer, actors: executor.EpisodeExecutor
) -> None:
    await abort_reaches_every_worker(server, actors, ray_args, WORKERS)


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
    finally:
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
async def test_a_lost_node_fails_exactly_its_episodes_and_a_replacement_is_placed_elsewhere(
    server: DevServer,
    actors: executor.EpisodeExecutor,
    ray_cluster: Any,  # noqa: F811
) -> None:
    head = ray_cluster.head_node.node_id
    lost: list[str] = []

    def kill() -> str:
        victim = next(node for node in actors.worker_nodes if node != head)  # the head cannot go
        lost.append(victim)
        ray_cluster.remove_node(node_of(ray_cluster, victim))
        return victim

    failed, victim = await one_worker_dies(server, actors, ray_args, WORKERS, kill)
    for sample in failed:
        reason = sample.metadata["infra_error"]
        assert f"{victim[:8]}) died (Ray: its node has died)" in reason, reason
    assert victim not in actors.worker_nodes and len(set(actors.worker_nodes)) >= 1
