"""The sandbox's Ray backend: tool calls run in a pool of Ray actors, apart from the episodes.

Model-written code can take seconds of CPU per call; here it runs on the pool's actors (each a
:class:`~strands_slime.sandbox.zygote_backend.ZygoteBackend`, same isolation and limits) while the
episodes stay light. The pool belongs to the process that runs the episodes and dies with it. A call
is bounded: an actor silent :data:`ANSWER_GRACE_S` past the execution's timeout is taken for lost,
so a hung node cannot hold an episode. Dispatch, aborts, failures, placement: docs/executor.md,
"Tool calls apart from the episode".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

from strands_slime.aborts import wait_for
from strands_slime.ray_actors import (
    actor_gone_errors,
    actor_options,
    actor_unreachable_error,
    cluster_rooms,
    death_reason,
    one_line,
    pick_room,
    pinned_to,
)
from strands_slime.sandbox.base import SandboxError, SandboxMisconfigured
from strands_slime.sandbox.config import SandboxConfig
from strands_slime.sandbox.result import ExecutionResult, ResultKind
from strands_slime.sandbox.zygote_backend import ZygoteBackend

logger = logging.getLogger(__name__)

MAX_CALLS_PER_ACTOR = 100_000
"""The actor's ``max_concurrency`` for Ray: its own semaphore bounds the executions."""
_MAX_RESTART_DELAY_S = 30.0
_REWATCH_DELAY_S = 1.0
ANSWER_GRACE_S = 10.0
"""How much longer than the execution's own timeout a sandbox actor may take to answer before it is
taken for lost (a hung or unreachable node: the call becomes an ``INFRA`` result, the actor is replaced)."""


def actor_concurrency(config: SandboxConfig) -> int:
    """Executions one actor runs at once: ``max_concurrency``, else 4 per CPU it reserves (at least 1)."""
    if config.max_concurrency is not None:
        return config.max_concurrency
    return max(1, math.ceil(4 * float(config.ray_resources.get("CPU", 1.0))))


class SandboxActor:
    """A Ray actor holding one zygote sandbox (created by :class:`RayBackend`)."""

    def __init__(self, config: SandboxConfig) -> None:
        inner = config.model_copy(update={"backend": "zygote"})
        self._backend = ZygoteBackend(inner)
        self._semaphore = asyncio.Semaphore(actor_concurrency(config))

    async def start(self) -> dict[str, Any]:
        """Start the zygote; its capabilities, with this actor's node and pid."""
        import ray

        await self._backend.start()
        return {
            **self._backend.capabilities,
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
        }

    async def watch(self) -> None:
        """Never returns: the pending call fails when the actor dies, so the pool sees the death of an
        idle actor and sends it no call."""
        await asyncio.get_running_loop().create_future()

    async def execute(self, code: str, timeout_s: float, cpu_s: float) -> ExecutionResult:
        """One execution (the zygote kills it when this call is cancelled)."""
        async with self._semaphore:
            return await self._backend.execute(code, timeout_s, cpu_s)


class ActorPlacement(NamedTuple):
    """Where one sandbox actor of the pool runs, and its calls in flight."""

    node_id: str | None
    pid: int | None
    calls: int


@dataclass(eq=False)
class _Member:
    """One actor of the pool, as the owner sees it."""

    actor: Any
    inflight: int = 0
    dead: str | None = None
    node_id: str | None = None
    pid: int | None = None


class RayBackend:
    """A pool of :class:`SandboxActor` on the Ray cluster (a ``Sandbox`` backend)."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.capabilities: dict[str, Any] = {}
        self.max_concurrency = config.ray_actors * actor_concurrency(config)
        """What the ``Sandbox`` front lets through at once: every actor's share."""
        self._members: list[_Member] = []
        self._actor_class: Any = None
        self._started: asyncio.Future[None] | None = None
        self._replacing: set[asyncio.Task[None]] = set()
        self._ready = asyncio.Event()
        self._closed = False

    @property
    def pid(self) -> int | None:
        """No local long-lived process: the zygotes run in the actors."""
        return None

    @property
    def placements(self) -> list[ActorPlacement]:
        """Each live actor's node, pid and calls in flight."""
        return [ActorPlacement(m.node_id, m.pid, m.inflight) for m in self._members if m.dead is None]

    def _options(self) -> dict[str, Any]:
        """The actor's Ray options: on this process's node (``ray_same_node``), on the allowed node with
        the most room (``ray_placement``), else where ``ray_strategy`` puts it; blocking."""
        import ray

        strategy: Any = self.config.ray_strategy
        if self.config.ray_same_node:
            strategy = pinned_to(ray.get_runtime_context().get_node_id())
        elif self.config.ray_placement.constrained:
            need = {name: amount for name, amount in self.config.ray_resources.items() if amount > 0}
            rooms = cluster_rooms(ray)
            room = pick_room(rooms, need, self.config.ray_placement)
            if room is None:
                where = "; ".join(
                    f"{r.name}: {r.refusal(self.config.ray_placement) or f'room for {r.fits(need)}'}"
                    for r in rooms
                )
                raise SandboxMisconfigured(
                    f"sandbox.ray_placement: no node has room for a sandbox actor of {need} ({where})"
                )
            strategy = pinned_to(room.node_id)
        return actor_options(self.config.ray_resources, strategy, max_concurrency=MAX_CALLS_PER_ACTOR)

    async def start(self) -> None:
        """Create and start every actor (once; concurrent callers share it). Raises ``SandboxError``."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        try:
            import ray
        except ImportError:
            raise SandboxMisconfigured(
                "sandbox.backend: ray needs the ray package, which is not installed (pip install ray)"
            ) from None
        if not ray.is_initialized():
            raise SandboxMisconfigured(
                "sandbox.backend: ray, but this process is not connected to a Ray cluster (slime's "
                "rollout actor and the executor's Ray workers are)"
            )
        self._actor_class = ray.remote(SandboxActor)
        members = await asyncio.gather(
            *(self._launch() for _ in range(self.config.ray_actors)), return_exceptions=True
        )
        errors = [m for m in members if isinstance(m, BaseException)]
        if errors:
            self._kill_members()
            raise errors[0]
        self._ready.set()

    async def _launch(self) -> _Member:
        import ray

        options = await asyncio.to_thread(self._options)
        member = _Member(self._actor_class.options(**options).remote(self.config))
        try:
            info = await wait_for(member.actor.start.remote(), self.config.start_timeout_s)
        except asyncio.TimeoutError:
            ray.kill(member.actor, no_restart=True)
            raise SandboxMisconfigured(
                f"sandbox.backend: ray: a sandbox actor of {dict(self.config.ray_resources)} was not "
                f"placed and started within start_timeout_s={self.config.start_timeout_s:g} s (too few "
                "free resources in the cluster?)"
            ) from None
        except Exception as exc:
            ray.kill(member.actor, no_restart=True)
            raise SandboxError(f"a sandbox actor could not start: {one_line(exc)}") from exc
        member.node_id, member.pid = info.pop("node_id"), info.pop("pid")
        self.capabilities = {**info, "ray_actors": self.config.ray_actors}
        if self._closed:
            ray.kill(member.actor, no_restart=True)
            raise SandboxError("the sandbox was closed during its start-up")
        self._members.append(member)
        self._watch(member)
        return member

    def _watch(self, member: _Member) -> None:
        """Hold the actor's ``watch`` call: its failure is the actor's death, seen with no call in flight."""
        loop = asyncio.get_running_loop()
        ref = member.actor.watch.remote()

        def arrived(done: Any) -> None:  # in Ray's thread
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(self._watched, member, done)

        ref.future().add_done_callback(arrived)

    def _watched(self, member: _Member, done: Any) -> None:
        import ray

        try:
            done.result()
        except actor_unreachable_error(ray):  # maybe only for now: watch again, in a second
            if member.dead is None and not self._closed:
                asyncio.get_running_loop().call_later(_REWATCH_DELAY_S, self._rewatch, member)
        except actor_gone_errors(ray) as exc:
            self._lost(member, death_reason(exc))
        except Exception as exc:
            self._lost(member, f"Ray: {type(exc).__name__}: {one_line(exc, 200)}")

    def _rewatch(self, member: _Member) -> None:
        if member.dead is None and not self._closed:
            self._watch(member)

    async def _pick(self) -> _Member | None:
        while not self._closed:
            live = [m for m in self._members if m.dead is None]
            if live:
                return min(live, key=lambda m: m.inflight)
            self._ready.clear()
            try:
                await wait_for(self._ready.wait(), self.config.start_timeout_s)
            except asyncio.TimeoutError:
                return None
        return None

    async def execute(self, code: str, timeout_s: float, cpu_s: float) -> ExecutionResult:
        """Run ``code`` in one actor of the pool; an actor's death is an ``INFRA`` result."""
        import ray

        started = asyncio.get_running_loop().time()
        try:
            await self.start()
        except SandboxError as exc:
            return ExecutionResult.failure(ResultKind.INFRA, str(exc))
        member = await self._pick()
        if member is None:
            return ExecutionResult.failure(ResultKind.INFRA, "no sandbox actor alive")
        # the zygote ends every execution at timeout_s; calls queued behind the actor's own limit wait
        # their turn: an actor that answers later than that is on a hung or unreachable node
        deadline = timeout_s * (1 + member.inflight // actor_concurrency(self.config)) + ANSWER_GRACE_S
        member.inflight += 1
        ref = member.actor.execute.remote(code, timeout_s, cpu_s)
        try:
            return await wait_for(asyncio.wrap_future(ref.future()), deadline)
        except asyncio.CancelledError:
            ray.cancel(ref)
            raise
        except asyncio.TimeoutError:
            ray.cancel(ref)
            reason = f"no answer within {deadline:g} s: its node is hung or unreachable"
            self._lost(member, reason)
            elapsed = asyncio.get_running_loop().time() - started
            return ExecutionResult.failure(ResultKind.INFRA, f"sandbox actor lost ({reason})", elapsed)
        except actor_gone_errors(ray) as exc:
            reason = death_reason(exc)
            elapsed = asyncio.get_running_loop().time() - started
            if isinstance(exc, actor_unreachable_error(ray)):  # maybe alive: its watch says whether it died
                return ExecutionResult.failure(
                    ResultKind.INFRA, f"sandbox actor unreachable ({reason})", elapsed
                )
            self._lost(member, reason)
            return ExecutionResult.failure(ResultKind.INFRA, f"sandbox actor died ({reason})", elapsed)
        finally:
            member.inflight -= 1

    def _lost(self, member: _Member, reason: str) -> None:
        if member.dead is not None or self._closed:
            return
        member.dead = reason
        if member in self._members:
            self._members.remove(member)
        with contextlib.suppress(Exception):  # unreachable may not mean dead: it must not go on
            import ray

            ray.kill(member.actor, no_restart=True)
        logger.error("sandbox actor (pid %s) died (%s); starting a replacement", member.pid, reason)
        task = asyncio.ensure_future(self._replace())
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self) -> None:
        delay = 1.0
        while not self._closed:
            try:
                await self._launch()
                self._ready.set()
                return
            except Exception as exc:
                logger.error("sandbox actor could not be replaced (retrying in %.0f s): %s", delay, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_RESTART_DELAY_S)

    async def close(self) -> None:
        """Kill every actor (their zygotes die with them)."""
        self._closed = True
        for task in list(self._replacing):
            task.cancel()
        self.kill()

    def kill(self) -> None:
        """``ray.kill`` every actor; never blocks for long."""
        self._closed = True
        self._kill_members()

    def _kill_members(self) -> None:
        with contextlib.suppress(ImportError):
            import ray

            for member in self._members:
                with contextlib.suppress(Exception):
                    ray.kill(member.actor, no_restart=True)
        self._members.clear()
