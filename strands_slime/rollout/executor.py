"""Episode executor: agent episodes in N workers, so the rollout side scales past one core.

slime drives every episode from one event loop, so our CPU per turn caps its turns per second. With
``executor: {workers: N}``, ``generate`` ships each episode to a local worker process (this module) or
a Ray actor (:mod:`~strands_slime.rollout.executor_ray`) and writes the result back onto slime's
``Sample``. This module owns what both backends share: dispatch, aborts, crashes, replacement,
lifetime. Only :data:`ARGS_FIELDS`, the config and :data:`SAMPLE_INPUT_FIELDS` cross; never a
tokenizer, a client or a whole ``Sample``. Design, wire format and tests: docs/executor.md, "How it works".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

from strands_slime.aborts import run_abortable, wait_for
from strands_slime.config import ConfigError, RolloutConfig
from strands_slime.rollout import pacing
from strands_slime.rollout.executor_wire import (
    HEADER,
    OPTIONAL_SAMPLE_ATTRIBUTES,
    PICKLE_PROTOCOL,
    WorkerLink,
    apply_result,
    encode,
    frame,
    pack_fields,
    unpicklable,
)
from strands_slime.rollout.sample_fill import SAMPLE_INPUT_FIELDS, mark_aborted_by_slime
from strands_slime.runtime import get_runtime

__all__ = [
    "ABORT_POLL_S",
    "ARGS_FIELDS",
    "OPTIONAL_SAMPLE_ATTRIBUTES",
    "SAMPLE_INPUT_FIELDS",
    "EpisodeExecutor",
    "ExecutorStats",
    "WorkerDied",
    "apply_result",
    "get_executor",
    "pack_fields",
    "running_executor",
    "shutdown_executors",
    "usable_cores",
]

logger = logging.getLogger(__name__)

ARGS_FIELDS: tuple[str, ...] = (
    "sglang_router_ip",
    "sglang_router_port",
    "sglang_server_concurrency",
    "rollout_num_gpus",
    "rollout_num_gpus_per_engine",
    "router_policy",
    "hf_checkpoint",
    "rollout_max_response_len",
    "rollout_max_context_len",
    "eval_max_response_len",
    "eval_max_context_len",
    "rollout_top_p",
    "use_rollout_routing_replay",
    "num_layers",
    "moe_router_topk",
    "sglang_speculative_algorithm",
    "partial_rollout",
    "mask_offpolicy_in_partial_rollout",
    "rollout_function_path",
    "reward_key",
    "eval_reward_key",
    "n_samples_per_prompt",
    "n_samples_per_eval_prompt",
)
"""The ``args`` fields our generate, client, sample filling and preset reward read; only these are shipped."""

ABORT_POLL_S = 0.01
"""How often slime's abort flag is read while episodes are in flight."""

_WORKER_EXIT_GRACE_S = 5.0
_KILL_WAIT_S = 5.0
"""How long :meth:`EpisodeExecutor.kill` waits for the killed workers to exit."""
_MAX_RESTART_DELAY_S = 30.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding strands_slime/


class WorkerDied(RuntimeError):
    """The worker running an episode died, or no worker could be started for it."""


@dataclasses.dataclass
class ExecutorStats:
    """Counters of one executor, for benchmarks and tests (read them, never rely on them for control)."""

    episodes: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    parent_codec_seconds: float = 0.0
    """CPU spent on slime's loop to encode episodes and decode and apply results."""
    worker_codec_seconds: float = 0.0
    """Time the workers spent packing and encoding results."""
    workers_started: int = 0
    worker_crashes: int = 0
    abort_propagation_seconds: list[float] = dataclasses.field(default_factory=list)
    """Per (abort change, worker): from the parent reading the flag to the worker's acknowledgment
    arriving back (a round trip on the parent's clock: the worker's flag was set before it)."""
    abort_seen_at: list[float] = dataclasses.field(default_factory=list)
    """Per (abort change, worker): the parent's ``time.monotonic()`` when the worker's acknowledgment arrived."""


@dataclasses.dataclass
class _Channel:
    """One abort flag of the parent (slime's ``GenerateState`` in practice), mirrored in every worker;
    ``version`` counts its changes, so workers apply them in order whatever the transport does."""

    id: int
    check: Any
    aborted: bool = False
    version: int = 0
    inflight: int = 0


class _WorkerHandle:
    """The parent's view of one worker, whatever link carries its messages."""

    def __init__(self, index: int, link: WorkerLink) -> None:
        self.index = index
        self.link = link
        self.inflight: dict[int, asyncio.Future[Any]] = {}
        self.ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.pid: int | None = getattr(link, "pid", None)
        self.where: str | None = None
        """Where it runs, as the worker reported it (a Ray node), once ready."""
        self.node_id: str | None = None
        self.dead_reason: str | None = None
        self.reader: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.dead_reason is None and self.ready.done() and not self.ready.exception()

    @property
    def name(self) -> str:
        return f"executor worker {self.index} ({self.link.describe(self.pid, self.where)})"

    def send(self, kind: str, payload: bytes) -> None:
        if self.dead_reason is None:
            self.link.send(kind, payload)


class WorkerBackend(Protocol):
    """Where the workers of one executor run: local processes (:class:`LocalBackend`) or Ray actors
    (:class:`strands_slime.rollout.executor_ray.RayBackend`)."""

    def check(self, config: RolloutConfig) -> None:
        """Refuse a misconfiguration before anything starts (:class:`ConfigError`); never blocks."""
        ...

    async def prepare(self) -> None:
        """Everything before the first worker (connect to the cluster, check its resources); raises
        :class:`ConfigError`."""
        ...

    async def launch(self, index: int) -> WorkerLink:
        """Start worker ``index`` (it then waits for its ``init`` message)."""
        ...

    async def close(self) -> None:
        """Release what :meth:`prepare` took (after every worker stopped)."""
        ...


# ---------------------------------------------------------------------- local worker processes


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running, killed"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class _ProcessLink:
    """A local worker process (``python -m strands_slime.rollout.executor_worker``): messages on its
    stdin and stdout, each behind an 8-byte length."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.pid = process.pid

    def describe(self, pid: int | None, where: str | None) -> str:
        return f"pid {self.pid}"

    def send(self, kind: str, payload: bytes) -> None:
        stdin = self.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.write(frame(payload))

    async def replies(self) -> AsyncIterator[bytes]:
        stream = self.process.stdout
        assert stream is not None
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                (size,) = HEADER.unpack(await stream.readexactly(HEADER.size))
                yield await stream.readexactly(size)

    async def death(self) -> str:
        try:
            await wait_for(self.process.wait(), _WORKER_EXIT_GRACE_S)
        except asyncio.TimeoutError:  # closed its stdout but kept running
            self.kill()
            await self.process.wait()
        return _describe_exit(self.process.returncode)

    async def stop(self, grace_s: float) -> None:
        self.send("stop", encode(("stop",)))
        try:
            await wait_for(self.process.wait(), grace_s)
        except asyncio.TimeoutError:
            self.kill()
            await self.process.wait()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            os.kill(self.process.pid, signal.SIGKILL)

    def running(self) -> bool:
        return self.process.returncode is None and _process_running(self.process.pid)

    def release(self) -> None:
        """Close the subprocess transport (asyncio keeps no public handle of it): one left open is closed
        by its finalizer, which fails once the loop is closed."""
        transport = getattr(self.process, "_transport", None)
        if transport is not None:
            transport.close()


class LocalBackend:
    """Workers as child processes of slime's rollout process, on its machine's cores."""

    def check(self, config: RolloutConfig) -> None:
        """More workers than usable cores needs ``oversubscribe: true``."""
        workers = config.executor.workers or 0
        cores = usable_cores()
        if workers > cores and not config.executor.oversubscribe:
            raise ConfigError(
                f"executor.workers={workers} is more than the {cores} CPU cores this process may use; "
                "lower it or set executor.oversubscribe: true"
            )

    async def prepare(self) -> None:
        """Nothing to prepare on this machine."""

    async def launch(self, index: int) -> WorkerLink:
        """A worker process (it dies with this one: ``PR_SET_PDEATHSIG`` and the end of its stdin)."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "strands_slime.rollout.executor_worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        return _ProcessLink(process)

    async def close(self) -> None:
        """Nothing to release."""


def worker_backend(config: RolloutConfig) -> WorkerBackend:
    """The backend ``config.executor.backend`` names."""
    if config.executor.backend == "ray":
        from strands_slime.rollout.executor_ray import RayBackend

        return RayBackend(config)
    return LocalBackend()


# ---------------------------------------------------------------------- the executor


class EpisodeExecutor:
    """N workers running episodes for one event loop, one ``args`` shape and one config."""

    def __init__(
        self, args_fields: dict[str, Any], config: RolloutConfig, backend: WorkerBackend | None = None
    ) -> None:
        workers = config.executor.workers
        if workers is None or workers < 1:
            raise ConfigError(f"executor.workers must be >= 1, got {workers}")
        self.config = config
        self.size = workers
        self.backend = backend if backend is not None else worker_backend(config)
        self.stats = ExecutorStats()
        self._init_payload = encode(("init", (args_fields, config)))
        self._workers: dict[int, _WorkerHandle] = {}
        self._channels: dict[Any, _Channel] = {}
        self._ids = itertools.count()
        self._inflight = 0
        self._poll_handle: asyncio.TimerHandle | None = None
        self._worker_ready = asyncio.Event()
        self._replacements: dict[int, asyncio.Task[None]] = {}
        self._loop = asyncio.get_running_loop()
        self.closed = False
        self._callers: dict[tuple[int, int], tuple[Any, RolloutConfig]] = {}
        self.started: asyncio.Future[EpisodeExecutor] | None = None
        """The start-up (:meth:`start` as a task), shared by every episode that waits for it."""

    def remember_caller(self, args: Any, config: RolloutConfig) -> None:
        """Serve later episodes with these very objects without a key lookup (:func:`running_executor`);
        both are held, so their ids cannot be reused by others while the executor lives."""
        self._callers[(id(args), id(config))] = (args, config)

    def serves(self, args: Any, config: RolloutConfig) -> bool:
        """Whether :meth:`remember_caller` saw these very objects."""
        return (id(args), id(config)) in self._callers

    def __repr__(self) -> str:
        return (
            f"<EpisodeExecutor backend={self.config.executor.backend} workers={self.size} "
            f"pids={self.worker_pids} closed={self.closed}>"
        )

    # ------------------------------------------------------------------ start-up and lifetime

    async def start(self) -> EpisodeExecutor:
        """Prepare the backend, start every worker and wait until all are warmed up; a failure stops
        them all and raises :class:`ConfigError` with the reason."""
        try:
            await self.backend.prepare()
        except BaseException:
            await self.close()
            raise
        results = await asyncio.gather(
            *(self._spawn(index) for index in range(self.size)), return_exceptions=True
        )
        errors = [result for result in results if isinstance(result, BaseException)]
        if errors:
            await self.close()
            first = errors[0]
            if isinstance(first, ConfigError):
                raise first
            raise ConfigError(f"executor workers could not start: {type(first).__name__}: {first}")
        return self

    async def _spawn(self, index: int) -> _WorkerHandle:
        link = await self.backend.launch(index)
        if self.closed:  # closed while this worker started: it never joins
            link.kill()
            await link.death()
            raise WorkerDied("the episode executor was closed during its start-up")
        worker = _WorkerHandle(index, link)
        self._workers[index] = worker
        worker.reader = asyncio.ensure_future(self._read(worker))
        worker.send("init", self._init_payload)
        timeout = self.config.executor.start_timeout_s
        try:
            await wait_for(asyncio.shield(worker.ready), timeout)
        except asyncio.TimeoutError:
            link.kill()
            raise ConfigError(
                f"{worker.name} did not start within executor.start_timeout_s={timeout:g} s"
            ) from None
        except BaseException:  # it reported why it cannot start (or we were cancelled): leave no worker
            link.kill()
            raise
        self.stats.workers_started += 1
        self._worker_ready.set()
        return worker

    @property
    def worker_pids(self) -> list[int]:
        """PIDs of the live workers (on their own node, for Ray actors)."""
        return [worker.pid for worker in self._workers.values() if worker.alive and worker.pid is not None]

    @property
    def worker_nodes(self) -> list[str | None]:
        """Where each live worker runs: its Ray node id (None for local processes)."""
        return [worker.node_id for worker in self._workers.values() if worker.alive]

    def kill(self, wait_s: float = _KILL_WAIT_S) -> None:
        """Kill every worker at once and wait until they have exited (at most ``wait_s``).

        Synchronous, for callers without this executor's loop running (``Runtime.reset``, interpreter
        exit); from the executor's loop prefer :meth:`close`. Killed local workers are reaped by
        asyncio's child watcher."""
        self.closed = True
        links = [worker.link for worker in self._workers.values()]
        for link in links:
            link.kill()
        deadline = time.monotonic() + wait_s
        while any(link.running() for link in links):
            if time.monotonic() > deadline:
                logger.error(
                    "executor workers %s still running %.0f s after SIGKILL", self.worker_pids, wait_s
                )
                return
            time.sleep(0.005)
        self._close_transports_on_loop(max(0.0, deadline - time.monotonic()))

    def _close_transports_on_loop(self, wait_s: float) -> None:
        """Release the workers' links on their own loop when it runs in another thread (slime's rollout
        thread), waiting at most ``wait_s``: a subprocess transport left open is closed by its
        finalizer, which fails once that loop is closed (an unraisable ``Event loop is closed``)."""
        loop = self._loop
        if loop.is_closed() or not loop.is_running():
            return
        done = threading.Event()

        def close_all() -> None:
            for worker in self._workers.values():
                worker.link.release()
            done.set()

        try:
            loop.call_soon_threadsafe(close_all)
        except RuntimeError:  # the loop closed meanwhile
            return
        done.wait(wait_s)

    async def close(self) -> None:
        """Stop every worker (they exit at once; killed after a grace period) and fail what is in flight.

        A start-up still under way is cancelled first (its workers are killed); safe to call again."""
        if self.closed and not self._workers:
            return
        self.closed = True
        if (
            self.started is not None
            and not self.started.done()
            and self.started is not asyncio.current_task()
        ):
            self.started.cancel()
            await asyncio.gather(self.started, return_exceptions=True)
        for task in self._replacements.values():
            task.cancel()
        workers = list(self._workers.values())
        await asyncio.gather(*(worker.link.stop(_WORKER_EXIT_GRACE_S) for worker in workers))
        for worker in workers:
            if worker.reader is not None:
                await asyncio.gather(worker.reader, return_exceptions=True)
        if self._poll_handle is not None:
            self._poll_handle.cancel()
            self._poll_handle = None
        await self.backend.close()

    # ------------------------------------------------------------------ reading the workers

    async def _read(self, worker: _WorkerHandle) -> None:
        slice_started = time.perf_counter()
        try:
            async for payload in worker.link.replies():
                self.stats.bytes_received += len(payload)
                self._handle(worker, payload)
                if time.perf_counter() - slice_started > pacing.SLICE_S:
                    # buffered replies would otherwise all be read (and their episodes woken) in one
                    # loop iteration: hundreds of finished episodes at once stall slime's loop
                    await asyncio.sleep(0)
                    slice_started = time.perf_counter()
        except Exception:  # a corrupt stream: treat the worker as dead
            logger.exception("%s sent an unreadable message", worker.name)
            worker.link.kill()
        await self._worker_died(worker)

    def _handle(self, worker: _WorkerHandle, payload: bytes) -> None:
        message = pickle.loads(payload)
        kind = message[0]
        if kind in ("done", "config_error", "error"):
            future = worker.inflight.pop(message[1], None)
            if future is not None and not future.done():
                future.set_result(message)
        elif kind == "codec":
            self.stats.worker_codec_seconds += message[1]
        elif kind == "abort_seen":
            # on this process's clock only: a worker on another machine has another monotonic clock
            parent_time, now = message[3], time.monotonic()
            self.stats.abort_propagation_seconds.append(now - parent_time)
            self.stats.abort_seen_at.append(now)
        elif kind == "ready":
            _, worker.pid, where = message
            worker.where, worker.node_id = where.get("where"), where.get("node_id")
            if not worker.ready.done():
                worker.ready.set_result(worker.pid)
        elif kind == "init_error":
            _, category, text = message
            text = " ".join(str(text).split())  # one line, whatever the library's message looked like
            if not worker.ready.done():
                prefix = f"{worker.name} could not start"
                worker.ready.set_exception(ConfigError(f"{prefix}: {text}" if category != "config" else text))

    async def _worker_died(self, worker: _WorkerHandle) -> None:
        was_running = worker.alive
        how = await worker.link.death()
        worker.dead_reason = f"{worker.name} died ({how}) with this episode in flight"
        if not worker.ready.done():
            worker.ready.set_exception(
                ConfigError(f"{worker.name} exited during its start-up ({how}); its stderr says why")
            )
            worker.ready.exception()  # retrieved: a replacement's failure is logged, not warned about
        for future in worker.inflight.values():
            if not future.done():
                future.set_exception(WorkerDied(worker.dead_reason))
        worker.inflight.clear()
        if was_running and not self.closed:
            self.stats.worker_crashes += 1
            logger.error(
                "%s; starting a replacement", worker.dead_reason.removesuffix(" with this episode in flight")
            )
            if not any(w.alive for w in self._workers.values()):
                self._worker_ready.clear()
            self._replacements[worker.index] = asyncio.ensure_future(self._replace(worker.index))

    async def _replace(self, index: int) -> None:
        delay = 1.0
        while not self.closed:
            try:
                await self._spawn(index)
                return
            except Exception as exc:
                logger.error(
                    "executor worker %d could not be restarted (retrying in %.0f s): %s", index, delay, exc
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_RESTART_DELAY_S)

    # ------------------------------------------------------------------ aborts

    def _channel(self, check: Any) -> _Channel:
        channel = self._channels.get(check)
        if channel is None:
            channel = self._channels[check] = _Channel(next(self._ids), check)
        return channel

    def _sync(self, channel: _Channel) -> None:
        """Send the flag's change, if any, to every worker: before an episode is dispatched, so an
        episode never outruns the abort that precedes it, and every ABORT_POLL_S while any run."""
        aborted = bool(channel.check())
        if aborted == channel.aborted:
            return
        channel.aborted = aborted
        channel.version += 1
        payload = encode(("abort", channel.id, channel.version, aborted, time.monotonic()))
        for worker in self._workers.values():
            worker.send("abort", payload)

    def _poll(self) -> None:
        self._poll_handle = None
        for channel in list(self._channels.values()):
            self._sync(channel)
        if self._inflight and not self.closed:
            self._poll_handle = self._loop.call_later(ABORT_POLL_S, self._poll)

    def _release(self, channel: _Channel) -> None:
        channel.inflight -= 1
        self._inflight -= 1
        if channel.inflight == 0 and self._channels.get(channel.check) is channel:
            del self._channels[channel.check]
            payload = encode(("drop", channel.id))
            for worker in self._workers.values():
                worker.send("drop", payload)

    # ------------------------------------------------------------------ episodes

    async def _pick(self, abort_check: Any) -> _WorkerHandle:
        """The live worker with the fewest episodes in flight; waits (abortably, bounded) for a
        replacement when none is alive."""
        deadline = time.monotonic() + self.config.executor.start_timeout_s
        while True:
            live = [worker for worker in self._workers.values() if worker.alive]
            if live:
                return min(live, key=lambda worker: len(worker.inflight))
            if self.closed:
                raise WorkerDied("the episode executor was closed")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerDied(
                    f"no executor worker alive: none restarted within executor.start_timeout_s="
                    f"{self.config.executor.start_timeout_s:g} s"
                )
            self._worker_ready.clear()
            wait = asyncio.ensure_future(wait_for(self._worker_ready.wait(), remaining))
            with contextlib.suppress(asyncio.TimeoutError):
                await run_abortable(wait, abort_check, "waiting for an executor worker")

    async def run(self, episode: Any, kept_fields: tuple[str, ...] = ()) -> Any:
        """Run ``episode`` in a worker and apply the result onto its sample: a reset attempt, or, with
        ``kept_fields`` (:data:`strands_slime.rollout.sample_fill.RESUME_FIELDS`), an ABORTED sample
        whose saved episode goes on (the kept fields travel with the inputs).

        Returns:
            ``[sample]``, or the fan-out segments with ``sample`` first.
        """
        sample, abort_check = episode.sample, episode.abort_check
        sampling_params, evaluation = episode.sampling_params, episode.evaluation
        worker = await self._pick(abort_check)
        started = time.thread_time()
        inputs = {name: getattr(sample, name) for name in SAMPLE_INPUT_FIELDS if hasattr(sample, name)}
        for name in OPTIONAL_SAMPLE_ATTRIBUTES:
            value = getattr(sample, name, None)
            if value is not None:
                inputs[name] = value
        kept = pack_fields(sample, kept_fields) if kept_fields else None
        episode_id = next(self._ids)
        channel = self._channel(abort_check)
        self._sync(channel)
        flag = (channel.version, channel.aborted)  # the flag as this episode leaves, whatever overtakes it
        message = ("run", episode_id, channel.id, flag, inputs, dict(sampling_params), evaluation, kept)
        try:
            payload = encode(message)
        except Exception as exc:
            self._forget_if_unused(channel)
            fields = {**inputs, **(kept or {})}
            raise ConfigError(f"executor: {unpicklable(fields, 'sample.')}: {exc}") from exc
        future: asyncio.Future[Any] = self._loop.create_future()
        worker.inflight[episode_id] = future
        channel.inflight += 1
        self._inflight += 1
        if self._poll_handle is None:
            self._poll_handle = self._loop.call_later(ABORT_POLL_S, self._poll)
        worker.send("run", payload)
        self.stats.episodes += 1
        self.stats.bytes_sent += len(payload)
        self.stats.parent_codec_seconds += time.thread_time() - started
        try:
            reply = await future
        except asyncio.CancelledError:
            worker.send("cancel", encode(("cancel", episode_id)))
            raise
        finally:
            worker.inflight.pop(episode_id, None)
            self._release(channel)
        started = time.thread_time()
        kind = reply[0]
        if kind == "config_error":
            raise ConfigError(reply[2])
        if kind == "error":
            raise WorkerDied(f"{worker.name}: {reply[2]}")
        results = reply[2]
        outputs = [sample]
        if len(results) > 1:
            template = _copy(sample)
            outputs += [_copy(template) for _ in results[1:]]
        aborted = bool(abort_check())
        for target, fields in zip(outputs, results, strict=True):
            apply_result(target, fields)
            if aborted:
                mark_aborted_by_slime(target)
        self.stats.parent_codec_seconds += time.thread_time() - started
        return outputs

    def _forget_if_unused(self, channel: _Channel) -> None:
        """Forget a channel made for an episode that never left (its sample could not be sent)."""
        if channel.inflight == 0 and self._channels.get(channel.check) is channel:
            del self._channels[channel.check]


def _process_running(pid: int) -> bool:
    """Whether ``pid`` still runs (an exited child waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # pragma: no cover - no /proc (not Linux)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _copy(sample: Any) -> Any:
    import copy

    return copy.deepcopy(sample)


# ---------------------------------------------------------------------- slime's side: generate


def _args_fields(args: Any) -> dict[str, Any]:
    return {name: getattr(args, name) for name in ARGS_FIELDS if hasattr(args, name)}


def _check(args_fields: dict[str, Any], config: RolloutConfig, backend: WorkerBackend) -> None:
    backend.check(config)
    try:
        pickle.dumps(args_fields, protocol=PICKLE_PROTOCOL)
    except Exception as exc:
        raise ConfigError(f"executor: {unpicklable(args_fields, 'args.')}: {exc}") from exc
    try:
        pickle.dumps(config, protocol=PICKLE_PROTOCOL)
    except Exception as exc:  # pragma: no cover - a validated config holds plain values
        raise ConfigError(f"executor: the rollout config cannot be sent to a worker process: {exc}") from exc


def running_executor(args: Any, config: RolloutConfig) -> EpisodeExecutor | None:
    """The executor already running on this loop for these very ``args`` and config objects (slime's
    are the same for every episode): no key to build, no task to create per episode."""
    entries = get_runtime().executors.get(asyncio.get_running_loop())
    for executor in (entries or {}).values():
        if not executor.closed and executor.serves(args, config):
            return executor
    return None


async def get_executor(args: Any, config: RolloutConfig, abort_check: Any = None) -> EpisodeExecutor:
    """The running executor of this event loop for these ``args`` and this config, started on first use
    (shared by every episode that arrives meanwhile; a failed start is raised to all of them and the
    next call tries again). Held by the runtime, whose ``close()``/``reset()`` stop its workers.

    Raises:
        ConfigError: a misconfiguration (too many workers, an ``args`` field that cannot be sent, a
            worker that cannot start).
    """
    fields = _args_fields(args)
    key = (config.model_dump_json(), repr(sorted(fields.items())))  # by content: configs get re-parsed
    loop = asyncio.get_running_loop()
    runtime = get_runtime()
    with runtime.lock:
        entries = runtime.executors.setdefault(loop, {})
    running: EpisodeExecutor | None = entries.get(key)
    if running is None or running.closed:
        backend = worker_backend(config)
        _check(fields, config, backend)
        running = entries[key] = EpisodeExecutor(fields, config, backend)
        started = running.started = asyncio.ensure_future(running.start())

        def forget_failure(done: asyncio.Future[EpisodeExecutor]) -> None:
            if entries.get(key) is running and (done.cancelled() or done.exception() is not None):
                del entries[key]

        started.add_done_callback(forget_failure)
    assert running.started is not None
    try:
        await run_abortable(asyncio.shield(running.started), abort_check, "the episode executor's start-up")
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if running.started.cancelled() and not (current is not None and current.cancelling()):
            raise WorkerDied("the episode executor was closed during its start-up") from None
        raise
    if running.closed:
        raise WorkerDied("the episode executor was closed during its start-up")
    running.remember_caller(args, config)
    return running


async def shutdown_executors() -> None:
    """Stop every executor of the running event loop (``Runtime.close()`` stops those of every loop)."""
    loop = asyncio.get_running_loop()
    runtime = get_runtime()
    with runtime.lock:
        entries = runtime.executors.pop(loop, {})
    for running in entries.values():
        await running.close()
