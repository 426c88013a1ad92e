"""The episode executor's Ray backend: episode workers as Ray actors anywhere on slime's cluster.

``executor: {backend: ray, workers: N, resources: {CPU: 1}}`` in the rollout config. slime's rollout
process is a Ray actor already, connected to the cluster that runs its engines and trainers; the
executor creates N actors from it, each holding the very :class:`~strands_slime.rollout.executor_worker.
EpisodeRunner` a local worker process holds (one event loop, one HTTP client, one sandbox), and talks
to them with the same messages (:mod:`strands_slime.rollout.executor_wire`) as actor calls instead of
pipe frames. Everything else (dispatch, abort channels, crash handling, replacement, lifetime) is the
executor's own (:mod:`strands_slime.rollout.executor`).

* **Placement.** Each actor asks for ``resources`` (``CPU`` becomes ``num_cpus``, ``memory`` bytes,
  any other name a custom resource: start CPU-only nodes with ``ray start --resources
  '{"rollout_cpu": 16}'`` and ask for ``{rollout_cpu: 1}`` to keep episodes there) and is placed with
  ``strategy`` (``SPREAD`` by default: over every node with room, GPU nodes' spare cores and CPU-only
  nodes alike). A replacement is placed the same way, on whatever node still has room.
* **Aborts.** Abort changes go to every actor through a separate concurrency group (its own thread
  and event loop), so they never queue behind episodes; the flag is a ``threading.Event`` the episodes'
  checks read. Ray does not keep the order of an async actor's calls, so every change and every episode
  carries the channel's version (:mod:`~strands_slime.rollout.executor_wire`).
* **Crashes.** Actors are created with ``max_restarts=0`` and ``max_task_retries=0``: an episode is
  never re-run by Ray behind our back (it would send its requests and run its tools again). A dead
  actor (its process killed, its node lost) fails every pending call with ``ActorDiedError``; each
  actor also holds one call that never returns (``watch``), so a death is seen even with nothing in
  flight. The executor then fails exactly that actor's episodes and starts a replacement.
* **Lifetime.** The actors are owned by slime's rollout process (not detached): they die with it.
  ``close()`` kills them with ``ray.kill`` and returns once Ray reports them dead.
* **Misconfiguration** is one :class:`ConfigError` line before any worker starts: no ``ray`` module,
  no cluster connection (outside slime, ``address`` connects, e.g. ``auto``), a resource no node has,
  or fewer free resources than ``workers`` actors need.

The actor class names the worker module by string (as the local backend runs ``python -m
strands_slime.rollout.executor_worker``): the worker imports the episode, which imports the
executor, which imports this module.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import importlib.util
import logging
import os
import pickle
from collections.abc import AsyncIterator, Mapping
from typing import Any

from strands_slime.config import ConfigError, ExecutorConfig
from strands_slime.ray_actors import (
    DEFAULT_RESOURCES,
    actor_gone_errors,
    actor_options,
    death_reason,
    one_line,
)

logger = logging.getLogger(__name__)

WORKER_MODULE = "strands_slime.rollout.executor_worker"
"""Where the actor finds :class:`EpisodeRunner` (by name: see the module docstring)."""
MAX_EPISODES_PER_ACTOR = 1_000_000
"""The actor's ``max_concurrency``: Ray queues calls past it; the executor bounds episodes itself."""
CONTROL_GROUP = "control"
"""The concurrency group of aborts, drops, cancels and the death watch: never behind episodes."""


class EpisodeActor:
    """A Ray actor holding one worker's :class:`~strands_slime.rollout.executor_worker.EpisodeRunner`."""

    def __init__(self) -> None:
        self._runner = importlib.import_module(WORKER_MODULE).EpisodeRunner()

    async def init(self, payload: bytes) -> list[bytes]:
        """Warm up (tokenizer, sandbox, server) and report ``ready`` with this actor's node."""
        import ray

        context = ray.get_runtime_context()
        node_id, actor_id = context.get_node_id(), context.get_actor_id() or ""
        place = f"Ray actor {actor_id[:8]}, pid {os.getpid()} on node {ray.util.get_node_ip_address()} {node_id[:8]}"
        where = {"where": place, "node_id": node_id}
        return [await self._runner.init(pickle.loads(payload), where)]

    async def run(self, payload: bytes) -> list[bytes]:
        """Run one episode; its replies."""
        return await self._runner.run(pickle.loads(payload))

    async def control(self, payload: bytes) -> list[bytes]:
        """An abort, drop or cancel, applied at once (called in :data:`CONTROL_GROUP`)."""
        return self._runner.control(pickle.loads(payload))

    async def watch(self) -> None:
        """Never returns: the pending call fails when the actor dies (called in :data:`CONTROL_GROUP`)."""
        await asyncio.get_running_loop().create_future()

    async def placement(self) -> tuple[str, int]:
        """``(node id, pid)`` of this actor."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()


class RayLink:
    """One :class:`EpisodeActor` as the executor reaches it: each message is an actor call whose
    result (the worker's replies) arrives on this loop through a queue."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.pid: int | None = None
        self._loop = asyncio.get_running_loop()
        self._arrivals: asyncio.Queue[concurrent.futures.Future[Any]] = asyncio.Queue()
        self._pending: set[Any] = set()
        self._death: str | None = None
        self._gone = asyncio.Event()
        self._track(actor.watch.options(concurrency_group=CONTROL_GROUP).remote())

    def describe(self, pid: int | None, where: str | None) -> str:
        """``Ray actor 1a2b3c4d, pid 1234 on node 10.0.0.3 5e6f7a8b``, as the actor reported it."""
        return where or "a Ray actor not placed or started yet"

    def _track(self, ref: Any) -> None:
        self._pending.add(ref)
        ref.future().add_done_callback(lambda done, ref=ref: self._arrived(ref, done))

    def _arrived(self, ref: Any, done: concurrent.futures.Future[Any]) -> None:
        """In Ray's thread: hand the finished call to the loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._settle, ref, done)

    def _settle(self, ref: Any, done: concurrent.futures.Future[Any]) -> None:
        self._pending.discard(ref)
        self._arrivals.put_nowait(done)

    def send(self, kind: str, payload: bytes) -> None:
        """One message as an actor call (``stop`` is :meth:`stop`)."""
        if self._death is not None or kind == "stop":
            return
        actor = self.actor
        if kind == "run":
            ref = actor.run.remote(payload)
        elif kind == "init":
            ref = actor.init.remote(payload)
        else:
            ref = actor.control.options(concurrency_group=CONTROL_GROUP).remote(payload)
        self._track(ref)

    async def replies(self) -> AsyncIterator[bytes]:
        """The replies of every finished call; ends at the first sign of the actor's death."""
        import ray

        gone = actor_gone_errors(ray)
        try:
            while True:
                done = await self._arrivals.get()
                try:
                    payloads = done.result()
                except gone as exc:
                    self._death = death_reason(exc)
                    return
                except ray.exceptions.TaskCancelledError:
                    continue
                except Exception as exc:  # a call that failed in Ray itself: the actor is not usable
                    self._death = f"Ray: {type(exc).__name__}: {one_line(exc, 200)}"
                    return
                for payload in payloads or ():
                    yield payload
        finally:
            self.kill()  # unreachable may not mean dead: its episodes were failed, it must not go on
            self._gone.set()

    async def death(self) -> str:
        """Ray's reason (``its worker process has died``, ``its node has died``)."""
        return self._death or "Ray: the actor stopped answering"

    async def stop(self, grace_s: float) -> None:
        """``ray.kill`` (an actor's episodes end with it), then wait until Ray reports it dead."""
        self.kill()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._gone.wait(), grace_s)

    def release(self) -> None:
        """Nothing held on the loop: the actor handle goes with the link."""

    def kill(self) -> None:
        """``ray.kill`` without restart; returns at once."""
        import ray

        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)

    def running(self) -> bool:
        """Ray reaps a killed actor on its own node: nothing to wait for here."""
        return False


def _fits(pool: Mapping[str, float], need: Mapping[str, float], workers: int) -> int:
    """How many actors needing ``need`` fit in ``pool`` (``workers`` when they need nothing)."""
    return min((int(pool.get(name, 0.0) // amount) for name, amount in need.items()), default=workers)


def check_cluster(
    settings: ExecutorConfig, nodes: list[dict[str, Any]], available: Mapping[str, float]
) -> None:
    """Refuse resources no node has and more actors than the cluster's free resources hold."""
    workers = settings.workers or 0
    need = {name: amount for name, amount in (settings.resources or DEFAULT_RESOURCES).items() if amount > 0}
    alive = [node for node in nodes if node.get("Alive")]
    known = sorted({name for node in alive for name in node.get("Resources", {})} - {"object_store_memory"})
    for name in need:
        if not any(name in node.get("Resources", {}) for node in alive):
            raise ConfigError(
                f"executor.resources: no node of the Ray cluster has the resource {name!r} "
                f"(its {len(alive)} nodes have: {', '.join(n for n in known if not n.startswith('node:'))})"
            )
    placeable = sum(_fits(node.get("Resources", {}), need, workers) for node in alive)
    free = _fits(available, need, workers)
    if min(placeable, free) < workers:
        free_text = ", ".join(f"{name} {available.get(name, 0.0):g}" for name in need)
        raise ConfigError(
            f"executor.workers={workers} Ray actors of {dict(need)} each do not fit in the Ray cluster: "
            f"room for {min(placeable, free)} ({free_text} free on {len(alive)} nodes); add CPU nodes "
            "or lower executor.workers or executor.resources"
        )


def _connect_and_check(settings: ExecutorConfig) -> None:
    """Connect (when not yet connected and ``address`` says where) and check the cluster; blocking."""
    import ray

    if not ray.is_initialized():
        if settings.address is None:
            raise ConfigError(
                "executor.backend: ray, but this process is not connected to a Ray cluster (slime's "
                "rollout actor is); outside slime set executor.address (e.g. auto)"
            )
        try:
            ray.init(address=settings.address, log_to_driver=False, logging_level=logging.WARNING)
        except Exception as exc:
            raise ConfigError(
                f"executor.address={settings.address!r}: cannot connect to a Ray cluster: "
                f"{type(exc).__name__}: {one_line(exc)}"
            ) from exc
    check_cluster(settings, ray.nodes(), ray.available_resources())


class RayBackend:
    """Workers as Ray actors on slime's cluster (:class:`strands_slime.rollout.executor.WorkerBackend`)."""

    def __init__(self, settings: ExecutorConfig) -> None:
        self.settings = settings
        self._actor_class: Any = None

    def check(self, config: Any) -> None:
        """``ray`` must be importable (it is in slime's image; a test dependency here)."""
        if importlib.util.find_spec("ray") is None:
            raise ConfigError(
                "executor.backend: ray needs the ray package, which is not installed in this "
                "environment (slime's image has it; pip install ray)"
            )

    async def prepare(self) -> None:
        """Connect and check the cluster's resources (in a thread: Ray's calls block)."""
        await asyncio.to_thread(_connect_and_check, self.settings)

    def actor_options(self) -> dict[str, Any]:
        """``ray.remote`` options of one episode actor."""
        return actor_options(
            self.settings.resources,
            self.settings.strategy,
            max_concurrency=MAX_EPISODES_PER_ACTOR,
        )

    async def launch(self, index: int) -> RayLink:
        """Create one actor (Ray places it when it can; :class:`RayLink` waits for its replies)."""
        import ray

        if self._actor_class is None:
            self._actor_class = ray.remote(concurrency_groups={CONTROL_GROUP: 8})(EpisodeActor)
        actor = self._actor_class.options(**self.actor_options()).remote()
        return RayLink(actor)

    async def close(self) -> None:
        """The actors are gone; the cluster connection stays (it is slime's)."""
