"""The episode executor's Ray backend: episode workers as Ray actors anywhere on slime's cluster.

Each actor holds the very :class:`~strands_slime.rollout.executor_worker.EpisodeRunner` a local worker
process holds and gets the same messages (:mod:`~strands_slime.rollout.executor_wire`) as actor calls;
dispatch, aborts, crashes, replacement and lifetime are the executor's own. What is Ray's: placement
checked node by node before any actor starts (:func:`plan_placement`); aborts in a concurrency group of
their own, never behind episodes, each change carrying its version (Ray does not keep an async actor's
call order); ``max_restarts=0`` so no episode is re-run behind our back; and a bound on every wait
(:class:`RayLink`'s heartbeats). Design and measurements: docs/executor.md, "Across slime's Ray cluster".

The actor class names the worker module by string: the worker imports the episode, which imports the
executor, which imports this module.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import importlib
import importlib.util
import logging
import os
import pickle
import socket
import time
import warnings
from collections.abc import AsyncIterator, Mapping
from typing import Any, NamedTuple

from strands_slime.aborts import wait_for
from strands_slime.config import ConfigError, ExecutorConfig, RolloutConfig
from strands_slime.ray_actors import (
    DEFAULT_RESOURCES,
    HEAD_RESOURCE,
    NodeRoom,
    RayPlacement,
    actor_gone_errors,
    actor_options,
    actor_unreachable_error,
    cluster_rooms,
    death_reason,
    one_line,
    pick_room,
    pinned_to,
)

logger = logging.getLogger(__name__)

WORKER_MODULE = "strands_slime.rollout.executor_worker"
"""Where the actor finds :class:`EpisodeRunner` (by name: see the module docstring)."""
MAX_EPISODES_PER_ACTOR = 1_000_000
"""The actor's ``max_concurrency``: Ray queues calls past it; the executor bounds episodes itself."""
CONTROL_GROUP = "control"
"""The concurrency group of aborts, drops, cancels, heartbeats and the death watch: never behind episodes."""
_CONTROL_KINDS = ("abort", "drop", "cancel")
HEARTBEATS_PER_DEADLINE = 5
"""Heartbeats sent within ``actor_timeout_s``: a silence is a death only once all of them went unanswered."""
_GCS_QUERY_TIMEOUT_S = 2.0
"""How long the cluster's state service may take to say whether a silent actor's node is alive."""


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

    async def ping(self) -> None:
        """A heartbeat (called in :data:`CONTROL_GROUP`): answering it says the actor and its node are up."""

    async def placement(self) -> tuple[str, int]:
        """``(node id, pid)`` of this actor."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()


class _Call(NamedTuple):
    """One actor call in flight: its kind, and for an episode or a control message its bytes (to
    name the lost episode, or to send the message again, after a transient error)."""

    kind: str
    payload: bytes | None


class RayLink:
    """One :class:`EpisodeActor` as the executor reaches it: each message is an actor call whose result
    (the worker's replies) arrives on this loop through a queue. Every wait is bounded: a heartbeat every
    ``timeout_s / 5``, and an actor that answers none of five for ``timeout_s`` is declared dead. Ray's
    ``ActorUnavailableError`` is not a death: control messages go again, and a lost episode fails alone
    (it is never re-run: it may have sent requests and run tools)."""

    def __init__(self, actor: Any, timeout_s: float) -> None:
        self.actor = actor
        self.pid: int | None = None
        self.node_id: str | None = None
        self.timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self._arrivals: asyncio.Queue[tuple[_Call, concurrent.futures.Future[Any]] | None] = asyncio.Queue()
        self._pending: dict[Any, _Call] = {}
        self._death: str | None = None
        self._gone = asyncio.Event()
        self._answered_at = time.monotonic()
        """The last time the actor answered anything (one clock: this process's)."""
        self._unanswered_pings = 0
        """Heartbeats sent since the actor last answered: a silence is a death only if they went out."""
        self._unreachable: str | None = None
        """The last transient error since the actor last answered (None: it answers)."""
        self._lost_runs: list[bytes] = []
        """Episodes whose call failed transiently: failed alone once the actor answers again."""
        self._heartbeat: asyncio.Task[None] | None = None
        self._track(actor.watch.options(concurrency_group=CONTROL_GROUP).remote(), _Call("watch", None))

    def describe(self, pid: int | None, where: str | None) -> str:
        """``Ray actor 1a2b3c4d, pid 1234 on node 10.0.0.3 5e6f7a8b``, as the actor reported it."""
        return where or "a Ray actor not placed or started yet"

    def _track(self, ref: Any, call: _Call) -> None:
        self._pending[ref] = call
        ref.future().add_done_callback(lambda done, ref=ref: self._arrived(ref, done))

    def _arrived(self, ref: Any, done: concurrent.futures.Future[Any]) -> None:
        """In Ray's thread: hand the finished call to the loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._settle, ref, done)

    def _settle(self, ref: Any, done: concurrent.futures.Future[Any]) -> None:
        call = self._pending.pop(ref, None)
        if call is not None:
            self._arrivals.put_nowait((call, done))

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
        self._track(ref, _Call(kind, payload))

    def _die(self, reason: str) -> None:
        """Declare the actor dead with ``reason``: :meth:`replies` ends (its episodes fail)."""
        if self._death is None:
            self._death = reason
            self._arrivals.put_nowait(None)

    async def replies(self) -> AsyncIterator[bytes]:
        """The replies of every finished call; ends when the actor is dead or declared dead."""
        import ray

        gone = actor_gone_errors(ray)
        unreachable = actor_unreachable_error(ray)
        try:
            while self._death is None:
                arrival = await self._arrivals.get()
                if arrival is None:
                    return
                call, done = arrival
                try:
                    payloads = done.result()
                except unreachable as exc:
                    self._transient(call, exc)
                    continue
                except gone as exc:
                    self._die(death_reason(exc))
                    return
                except ray.exceptions.TaskCancelledError:
                    continue
                except Exception as exc:  # a call that failed in Ray itself: the actor is not usable
                    self._die(f"Ray: {type(exc).__name__}: {one_line(exc, 200)}")
                    return
                for payload in self._answered(call, payloads):
                    yield payload
        finally:
            if self._heartbeat is not None:
                self._heartbeat.cancel()
            self.kill()  # unreachable may not mean dead: its episodes were failed, it must not go on
            self._gone.set()

    def _answered(self, call: _Call, payloads: list[bytes] | None) -> list[bytes]:
        """The actor answered: it is reachable; episodes lost meanwhile fail alone."""
        self._answered_at = time.monotonic()
        self._unanswered_pings = 0
        replies = list(payloads or ())
        if self._unreachable is not None:
            logger.warning("Ray actor %s answers again after: %s", self._name(), self._unreachable)
            for lost in self._lost_runs:
                episode_id = pickle.loads(lost)[1]
                text = (
                    f"its call was lost to a transient Ray error ({self._unreachable}); the episode "
                    "is not run again (it may have sent requests and run tools)"
                )
                replies.append(pickle.dumps(("error", episode_id, text), protocol=5))
                self.send("cancel", pickle.dumps(("cancel", episode_id), protocol=5))
            self._lost_runs.clear()
            self._unreachable = None
        if call.kind == "init" and replies and self._heartbeat is None:
            ready = pickle.loads(replies[0])
            if ready[0] == "ready":
                self.pid, self.node_id = ready[1], ready[2].get("node_id")
                self._heartbeat = asyncio.ensure_future(self._beat())
        return replies

    def _transient(self, call: _Call, exc: BaseException) -> None:
        """A call failed with ``ActorUnavailableError``: the actor may be alive; its fate is decided by
        the next answer or by ``timeout_s`` of silence (:meth:`_beat`)."""
        self._unreachable = f"ActorUnavailableError: {one_line(exc, 160)}"
        if call.kind == "watch":
            self._track(self.actor.watch.options(concurrency_group=CONTROL_GROUP).remote(), call)
        elif call.kind in _CONTROL_KINDS and call.payload is not None:
            self.send(call.kind, call.payload)  # idempotent: abort changes carry their version
        elif call.kind == "run" and call.payload is not None:
            self._lost_runs.append(call.payload)
        elif call.kind == "init":
            self._die(f"Ray: its start-up call was lost ({self._unreachable})")

    async def _beat(self) -> None:
        """:data:`HEARTBEATS_PER_DEADLINE` heartbeats per ``timeout_s``; a death is ``timeout_s`` of silence
        with that many heartbeats unanswered. Counting them keeps a stall of this process (its loop or CPU
        starved: nothing was sent, or the answers wait unread) from passing for the actor's."""
        interval = self.timeout_s / HEARTBEATS_PER_DEADLINE
        while self._death is None:
            ref = self.actor.ping.options(concurrency_group=CONTROL_GROUP).remote()
            self._track(ref, _Call("ping", None))
            self._unanswered_pings += 1
            await asyncio.sleep(interval)
            silent = time.monotonic() - self._answered_at
            if (
                silent >= self.timeout_s
                and self._unanswered_pings >= HEARTBEATS_PER_DEADLINE
                and self._death is None
            ):
                self._die(await self._silence_reason(silent))
                return

    async def _silence_reason(self, silent: float) -> str:
        """Why the actor is silent, as far as a bounded look can tell: the cluster's state service has
        its node dead, or its node's raylet refuses connections (dead), accepts them (hung), or does
        not answer (unreachable)."""
        state = "hung or unreachable"
        if self.node_id is not None:
            with contextlib.suppress(Exception):
                state = await wait_for(asyncio.to_thread(_node_state, self.node_id), _GCS_QUERY_TIMEOUT_S * 2)
        if state.startswith("dead"):
            return "Ray: its node has died" + state.removeprefix("dead")
        last = f"; last error: {self._unreachable}" if self._unreachable else ""
        return (
            f"Ray: answered no heartbeat and no abort for {silent:.1f} s (executor.actor_timeout_s="
            f"{self.timeout_s:g}): its node is {state}{last}"
        )

    def _name(self) -> str:
        return f"pid {self.pid} on node {(self.node_id or '?')[:8]}"

    async def death(self) -> str:
        """Ray's reason (``its worker process has died``, ``its node has died``) or the silence's."""
        return self._death or "Ray: the actor stopped answering"

    async def stop(self, grace_s: float) -> None:
        """``ray.kill`` (an actor's episodes end with it), then wait until Ray reports it dead."""
        self.kill()
        with contextlib.suppress(asyncio.TimeoutError):
            await wait_for(self._gone.wait(), grace_s)
        if not self._gone.is_set():  # a frozen node never reports: stop waiting for it
            self._die("Ray: killed by the executor")

    def release(self) -> None:
        """Nothing held on the loop: the actor handle goes with the link."""

    def kill(self) -> None:
        """``ray.kill`` without restart; returns at once."""
        import ray

        if (
            not ray.is_initialized()
        ):  # the connection is gone, and the actors with it (ray.kill would start Ray)
            return
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)

    def running(self) -> bool:
        """Ray reaps a killed actor on its own node: nothing to wait for here."""
        return False


def _node_state(node_id: str) -> str:
    """``dead``, ``dead (...)``, ``hung (...)`` or ``unreachable (...)``: the node as the cluster's state
    service has it, else as its raylet's port answers a connection (blocking, bounded)."""
    import ray

    for node in ray.nodes():
        if node.get("NodeID") != node_id:
            continue
        if not node.get("Alive"):
            return "dead"
        address = (str(node.get("NodeManagerAddress")), int(node.get("NodeManagerPort") or 0))
        where = f"{address[0]}:{address[1]}"
        try:
            socket.create_connection(address, timeout=_GCS_QUERY_TIMEOUT_S).close()
        except ConnectionRefusedError:
            return f"dead (its raylet at {where} refuses connections; Ray has not noticed yet)"
        except OSError as exc:
            return f"unreachable (its raylet at {where}: {type(exc).__name__})"
        return f"hung (its raylet at {where} accepts connections, nothing answers)"
    return "dead"


# ---------------------------------------------------------------------- placement


def _positive(resources: Mapping[str, float] | None) -> dict[str, float]:
    return {name: amount for name, amount in (resources or DEFAULT_RESOURCES).items() if amount > 0}


def _text(resources: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in resources.items()) + "}"


def _rooms_text(rooms: list[NodeRoom], need: Mapping[str, float], placement: RayPlacement) -> str:
    """Each node and what fits there: ``10.0.0.2 5e6f7a8b: room for 1 (CPU 1.5 free)``."""
    parts = []
    for room in rooms:
        refusal = room.refusal(placement)
        if refusal is not None:
            parts.append(f"{room.name}: {refusal}")
            continue
        free = ", ".join(f"{name} {room.free.get(name, 0.0):g}" for name in need)
        parts.append(f"{room.name}: room for {min(room.fits(need), 1 << 20)} ({free} free)")
    return "; ".join(parts)


class PlacementPlan(NamedTuple):
    """The node each episode actor goes to (None: Ray's strategy chooses)."""

    nodes: list[str | None]


def plan_placement(config: RolloutConfig, rooms: list[NodeRoom]) -> PlacementPlan:
    """Place ``executor.workers`` episode actors and the sandbox's actors node by node on what is free
    (as Ray would place them: spread), or raise one :class:`ConfigError` line that says what does not
    fit where."""
    settings, sandbox = config.executor, config.sandbox
    workers = settings.workers or 0
    placement = settings.placement or RayPlacement()
    need = _positive(settings.resources)
    pool = sandbox.backend == "ray"
    sandbox_need = _positive(sandbox.ray_resources) if pool else {}
    per_actor = sandbox.ray_actors if pool else 0
    same_node = pool and sandbox.ray_same_node
    known = sorted({name for room in rooms for name in room.total} - {"object_store_memory"})
    for name, what in [
        *((n, "executor.resources") for n in need),
        *((n, "sandbox.ray_resources") for n in sandbox_need),
    ]:
        if not any(name in room.total for room in rooms):
            raise ConfigError(
                f"{what}: no node of the Ray cluster has the resource {name!r} (its {len(rooms)} nodes "
                f"have: {', '.join(n for n in known if not n.startswith('node:'))})"
            )
    unit = dict(need)
    if same_node:
        for name, amount in sandbox_need.items():
            unit[name] = unit.get(name, 0.0) + amount * per_actor
    working = copy.deepcopy(rooms)
    nodes: list[str | None] = []
    for _ in range(workers):
        room = pick_room(working, unit, placement)
        if room is None:
            with_sandbox = (
                f" each with its {per_actor} sandbox actors of {_text(sandbox_need)} on its node"
                if same_node
                else ""
            )
            raise ConfigError(
                f"placement: executor.workers={workers} episode actors of {_text(need)}{with_sandbox} do not "
                f"fit the Ray cluster's free resources: room for {len(nodes)} ({_rooms_text(rooms, unit, placement)}); "
                "add nodes, or lower executor.workers or the resources"
            )
        room.take(unit)
        nodes.append(room.node_id)
    if pool and not same_node:
        after = copy.deepcopy(working)
        wanted = workers * per_actor
        for placed in range(wanted):
            room = pick_room(working, sandbox_need, sandbox.ray_placement)
            if room is None:
                raise ConfigError(
                    f"placement: {wanted} sandbox actors of {_text(sandbox_need)} ({per_actor} per episode "
                    f"actor) do not fit beside the {workers} episode actors: room for {placed} "
                    f"({_rooms_text(after, sandbox_need, sandbox.ray_placement)}); add nodes, or lower "
                    "sandbox.ray_actors or sandbox.ray_resources"
                )
            room.take(sandbox_need)
    pinned = placement.constrained or same_node
    return PlacementPlan(nodes if pinned else [None] * workers)


def check_cluster(
    settings: ExecutorConfig, nodes: list[dict[str, Any]], available: Mapping[str, float]
) -> None:
    """Deprecated: :func:`plan_placement` with :func:`~strands_slime.ray_actors.cluster_rooms` checks node
    by node, the sandbox's actors counted. This keeps the old call working on ``ray.nodes()``' totals."""
    warnings.warn(
        "executor_ray.check_cluster is deprecated: use plan_placement(config, ray_actors.cluster_rooms(ray)), "
        "which checks node by node with the sandbox's actors counted",
        DeprecationWarning,
        stacklevel=2,
    )
    rooms = [
        NodeRoom(
            node_id=str(node.get("NodeID", "")),
            ip=str(node.get("NodeManagerAddress", "?")),
            head=HEAD_RESOURCE in node.get("Resources", {}),
            labels={},
            free={k: float(v) for k, v in node.get("Resources", {}).items()},
            total={k: float(v) for k, v in node.get("Resources", {}).items()},
        )
        for node in nodes
        if node.get("Alive")
    ]
    plan_placement(RolloutConfig(executor=settings), rooms)


def _connect_and_plan(config: RolloutConfig) -> PlacementPlan:
    """Connect (when not yet connected and ``address`` says where) and place the actors; blocking."""
    import ray

    settings = config.executor
    if not ray.is_initialized():
        if settings.address is None:
            raise ConfigError(
                "executor.backend: ray, but this process is not connected to a Ray cluster (slime's "
                "rollout actor is); outside slime set executor.address (e.g. auto)"
            )
        try:
            ray.init(
                address=settings.address,
                log_to_driver=bool(settings.log_to_driver),
                logging_level=logging.WARNING,
            )
        except Exception as exc:
            raise ConfigError(
                f"executor.address={settings.address!r}: cannot connect to a Ray cluster: "
                f"{type(exc).__name__}: {one_line(exc)}"
            ) from exc
    return plan_placement(config, cluster_rooms(ray))


def _replacement_node(config: RolloutConfig) -> str:
    """The node for a replacement actor under a placement: the allowed node with the most room now."""
    import ray

    unit = _positive(config.executor.resources)
    sandbox = config.sandbox
    if sandbox.backend == "ray" and sandbox.ray_same_node:
        for name, amount in _positive(sandbox.ray_resources).items():
            unit[name] = unit.get(name, 0.0) + amount * sandbox.ray_actors
    placement = config.executor.placement or RayPlacement()
    rooms = cluster_rooms(ray)
    room = pick_room(rooms, unit, placement)
    if room is None:
        raise ConfigError(
            f"placement: no node has room for a replacement episode actor of {_text(unit)} now "
            f"({_rooms_text(rooms, unit, placement)})"
        )
    return room.node_id


class RayBackend:
    """Workers as Ray actors on slime's cluster (:class:`strands_slime.rollout.executor.WorkerBackend`)."""

    def __init__(self, config: RolloutConfig) -> None:
        self.config = config
        self.settings = config.executor
        self._actor_class: Any = None
        self._plan: list[str | None] = []
        sandbox = config.sandbox
        self._pinned = (self.settings.placement or RayPlacement()).constrained or (
            sandbox.backend == "ray" and sandbox.ray_same_node
        )
        """Whether we choose each actor's node (a placement, or sandbox actors on their episode actor's node)."""

    def check(self, config: Any) -> None:
        """``ray`` must be importable (it is in slime's image; a test dependency here)."""
        if importlib.util.find_spec("ray") is None:
            raise ConfigError(
                "executor.backend: ray needs the ray package, which is not installed in this "
                "environment (slime's image has it; pip install ray)"
            )

    async def prepare(self) -> None:
        """Connect and place the actors node by node (in a thread: Ray's calls block)."""
        self._plan = list((await asyncio.to_thread(_connect_and_plan, self.config)).nodes)

    def actor_options(self, node_id: str | None = None) -> dict[str, Any]:
        """``ray.remote`` options of one episode actor (pinned to ``node_id`` when given)."""
        return actor_options(
            self.settings.resources,
            pinned_to(node_id) if node_id is not None else self.settings.strategy,
            max_concurrency=MAX_EPISODES_PER_ACTOR,
        )

    async def launch(self, index: int) -> RayLink:
        """Create one actor (Ray places it when it can; :class:`RayLink` waits for its replies): at
        start-up on the node the plan chose, a replacement on the allowed node with the most room."""
        import ray

        if self._actor_class is None:
            self._actor_class = ray.remote(concurrency_groups={CONTROL_GROUP: 8})(EpisodeActor)
        node: str | None = None
        if index < len(self._plan) and self._plan[index] is not None:
            node, self._plan[index] = self._plan[index], None  # the plan holds for the first start only
        elif self._pinned:
            node = await asyncio.to_thread(_replacement_node, self.config)
        actor = self._actor_class.options(**self.actor_options(node)).remote()
        return RayLink(actor, float(self.settings.actor_timeout_s or 5.0))

    async def close(self) -> None:
        """The actors are gone; the cluster connection stays (it is slime's)."""
