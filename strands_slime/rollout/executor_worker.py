"""An episode executor's worker: :class:`EpisodeRunner` runs the episodes the parent sends, whatever
carries the messages; ``python -m strands_slime.rollout.executor_worker`` is the local worker process
(started by :class:`strands_slime.rollout.executor.EpisodeExecutor`, never by hand) that reads them from
its stdin, and :mod:`strands_slime.rollout.executor_ray` hosts the same runner in a Ray actor.

One event loop runs the episodes through the in-process path (:meth:`Episode.run`) and sends back the
fields ``generate`` wrote; abort changes set the worker's flag from whichever thread receives them, so
an abort lands at once, whatever the loop is doing. See ``docs/executor.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

from strands_slime.config import ConfigError, get_rollout_config
from strands_slime.rollout import slime_compat
from strands_slime.rollout.episode import Episode
from strands_slime.rollout.executor_wire import (
    HEADER,
    OPTIONAL_SAMPLE_ATTRIBUTES,
    apply_result,
    encode,
    frame,
    pack_fields,
)
from strands_slime.rollout.gc_policy import tune_gc_once
from strands_slime.rollout.sample_fill import SAMPLE_RESULT_FIELDS
from strands_slime.rollout.startup import warm_up

logger = logging.getLogger(__name__)
WORKER_LOG_ENV = "STRANDS_SLIME_WORKER_LOG"
"""A file the workers append their warnings to instead of stderr (the offline rollout's log: its
terminal shows the progress bar, and ``--quiet`` nothing)."""


def pack_result(sample: Any) -> dict[str, Any]:
    """The fields ``generate`` wrote on ``sample`` (a worker's), in plain picklable form; long number
    lists travel as arrays (:func:`~strands_slime.rollout.executor_wire.apply_result` turns them back into lists)."""
    return pack_fields(sample, (*SAMPLE_RESULT_FIELDS, *OPTIONAL_SAMPLE_ATTRIBUTES))


class EpisodeRunner:
    """A worker's episodes and abort flags, whatever carries its messages.

    :meth:`control` (aborts, drops, cancels) may be called from any thread; :meth:`init` and :meth:`run`
    run on the worker's event loop. Each returns the encoded replies for the parent.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flags: dict[int, tuple[int, threading.Event]] = {}
        """Per abort channel: the newest version seen and the flag episodes of that channel read."""
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._cancelled: set[int] = set()
        self._base_args: SimpleNamespace | None = None
        self._sample_class: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _flag(self, channel: int, version: int, aborted: bool) -> threading.Event:
        """The channel's flag, set or cleared unless a newer change was applied already."""
        with self._lock:
            current = self._flags.get(channel)
            if current is None or version > current[0]:
                event = current[1] if current is not None else threading.Event()
                event.set() if aborted else event.clear()
                self._flags[channel] = (version, event)
                return event
            return current[1]

    def control(self, message: Any) -> list[bytes]:
        """Apply an ``abort``, ``drop`` or ``cancel`` message at once (any thread)."""
        kind = message[0]
        if kind == "abort":
            _, channel, version, aborted, parent_time = message
            self._flag(channel, version, aborted)
            return [encode(("abort_seen", channel, aborted, parent_time, time.monotonic()))]
        if kind == "drop":
            with self._lock:
                self._flags.pop(message[1], None)
        elif kind == "cancel" and self._loop is not None:
            self._loop.call_soon_threadsafe(self._cancel, message[1])
        return []

    async def init(self, message: Any, where: dict[str, Any]) -> bytes:
        """Warm up for ``("init", (args_fields, config))``: the ``ready`` reply, or why not."""
        self._loop = asyncio.get_running_loop()
        args_fields, config = message[1]
        slime_compat.detach_from_generate_state()
        args = SimpleNamespace(**args_fields)
        args.strands_slime = config
        args.abort_event = None
        self._base_args = args
        try:
            self._sample_class = slime_compat.sample_class()
            if config.gc_tuning:
                tune_gc_once()
            await warm_up(args, config, None)
        except ConfigError as exc:
            return encode(("init_error", "config", str(exc)))
        except Exception as exc:
            logger.exception("executor worker start-up failed")
            return encode(("init_error", "error", f"{type(exc).__name__}: {exc}"))
        return encode(("ready", os.getpid(), where))

    def _cancel(self, episode_id: int) -> None:
        task = self._tasks.get(episode_id)
        if task is not None:
            task.cancel()
        else:  # the cancel overtook its episode (Ray keeps no order between calls)
            self._cancelled.add(episode_id)

    async def run(self, message: Any) -> list[bytes]:
        """Run one ``run`` message's episode: its ``done`` and ``codec`` replies, an error reply, or
        nothing when the parent cancelled it."""
        _, episode_id, channel, (version, aborted), inputs, sampling_params, evaluation, kept = message
        if episode_id in self._cancelled:
            self._cancelled.discard(episode_id)
            return []
        event = self._flag(channel, version, aborted)
        task = asyncio.ensure_future(self._episode(inputs, sampling_params, evaluation, event, kept))
        self._tasks[episode_id] = task
        try:
            result = await task
        except asyncio.CancelledError:
            if not task.cancelled():
                task.cancel()
                raise  # the caller itself was cancelled
            return []
        except ConfigError as exc:
            return [encode(("config_error", episode_id, str(exc)))]
        except Exception as exc:
            logger.exception("executor worker: episode %d failed", episode_id)
            return [encode(("error", episode_id, f"{type(exc).__name__}: {exc}"))]
        finally:
            self._tasks.pop(episode_id, None)
        started = time.thread_time()
        packed = [pack_result(item) for item in (result if isinstance(result, list) else [result])]
        done = encode(("done", episode_id, packed))
        return [done, encode(("codec", time.thread_time() - started))]

    async def _episode(
        self,
        inputs: dict[str, Any],
        sampling_params: Any,
        evaluation: bool,
        event: threading.Event,
        kept: dict[str, Any] | None,
    ) -> Any:
        args = SimpleNamespace(**vars(self._base_args))
        args.abort_event = event
        optional = {name: inputs.pop(name) for name in OPTIONAL_SAMPLE_ATTRIBUTES if name in inputs}
        sample = self._sample_class(**inputs)
        for name, value in optional.items():
            setattr(sample, name, value)
        if kept is not None:  # an ABORTED sample that resumes: rollout's own path finds its kept part
            apply_result(sample, kept)
        config = get_rollout_config(args)
        return await Episode(args, sample, sampling_params, evaluation, config).run()


# ---------------------------------------------------------------------- the local worker process

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux); the end of stdin covers the rest."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)


class _PipeServer:
    """A local worker: messages on the pipes, an :class:`EpisodeRunner` on this event loop; a control
    thread reads the pipe, so an abort is applied whatever the loop is doing."""

    def __init__(self, fd_in: int, fd_out: int) -> None:
        self._fd_in = fd_in
        self._fd_out = fd_out
        self._runner = EpisodeRunner()
        self._answering: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport, _ = await self._loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(self._fd_out, "wb", buffering=0)
        )
        self._stopped = self._loop.create_future()
        threading.Thread(target=self._read_control, name="executor-control", daemon=True).start()
        await self._stopped

    def _write(self, payloads: list[bytes]) -> None:
        for payload in payloads:
            self._transport.write(frame(payload))

    def _reply_to(self, coroutine: Any) -> None:
        async def answer() -> None:
            reply = await coroutine
            self._write(reply if isinstance(reply, list) else [reply])

        task = asyncio.ensure_future(answer())
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    def _read_control(self) -> None:
        """Runs in its own thread: an abort sets the flag at once, whatever the event loop is doing."""
        runner, loop = self._runner, self._loop
        with os.fdopen(self._fd_in, "rb") as stream:
            while True:
                header = stream.read(HEADER.size)
                if len(header) < HEADER.size:
                    break
                (size,) = HEADER.unpack(header)
                payload = stream.read(size)
                if len(payload) < size:
                    break
                message = pickle.loads(payload)
                kind = message[0]
                if kind == "run":
                    loop.call_soon_threadsafe(lambda m=message: self._reply_to(runner.run(m)))
                elif kind == "init":
                    where = {"where": socket.gethostname(), "node_id": None}
                    loop.call_soon_threadsafe(lambda m=message, w=where: self._reply_to(runner.init(m, w)))
                elif kind == "stop":
                    break
                else:
                    replies = runner.control(message)
                    if replies:
                        loop.call_soon_threadsafe(self._write, replies)
        os._exit(0)  # the parent is gone or asked us to stop; the sandbox zygote dies with us


def worker_main() -> int:
    """Entry point of a worker process (``python -m strands_slime.rollout.executor_worker``, started by the parent)."""
    fd_in, fd_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # prints go to stderr; fd_out carries only our frames
    _die_with_parent()
    if os.getppid() == 1:  # the parent died before the line above
        return 1
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s strands_slime executor worker %(process)d %(levelname)s %(name)s: %(message)s",
        filename=os.environ.get(WORKER_LOG_ENV) or None,  # None: stderr
    )
    asyncio.run(_PipeServer(fd_in, fd_out).serve())
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
