"""An episode executor's worker process: ``python -m strands_slime.rollout.executor_worker`` (started by
:class:`strands_slime.rollout.executor.EpisodeExecutor`, never by hand).

One event loop runs the episodes the parent sends through the in-process path (:meth:`Episode.run`) and
sends back the fields ``generate`` wrote; a control thread reads the pipe, so an abort sets the
worker's flag at once, whatever the loop is doing. See ``docs/executor.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import pickle
import signal
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

from strands_slime.config import ConfigError, get_rollout_config
from strands_slime.rollout import slime_compat
from strands_slime.rollout.episode import Episode
from strands_slime.rollout.executor import (
    _HEADER,
    _PICKLE_PROTOCOL,
    OPTIONAL_SAMPLE_ATTRIBUTES,
    _frame,
    apply_result,
    pack_fields,
)
from strands_slime.rollout.gc_policy import tune_gc_once
from strands_slime.rollout.sample_fill import SAMPLE_RESULT_FIELDS
from strands_slime.rollout.startup import warm_up

logger = logging.getLogger(__name__)


def pack_result(sample: Any) -> dict[str, Any]:
    """The fields ``generate`` wrote on ``sample`` (a worker's), in plain picklable form; long number
    lists travel as arrays (:func:`~strands_slime.rollout.executor.apply_result` turns them back into lists)."""
    return pack_fields(sample, (*SAMPLE_RESULT_FIELDS, *OPTIONAL_SAMPLE_ATTRIBUTES))


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux); the end of stdin covers the rest."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)


class _WorkerServer:
    """A worker's event loop: episodes from the parent, results back; a control thread reads the pipe."""

    def __init__(self, fd_in: int, fd_out: int) -> None:
        self._fd_in = fd_in
        self._fd_out = fd_out
        self._events: dict[int, threading.Event] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._base_args: SimpleNamespace | None = None
        self._sample_class: Any = None

    async def serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport, _ = await self._loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(self._fd_out, "wb", buffering=0)
        )
        self._stopped = self._loop.create_future()
        threading.Thread(target=self._read_control, name="executor-control", daemon=True).start()
        await self._stopped

    def _send(self, message: Any) -> None:
        self._transport.write(_frame(message))

    def _read_control(self) -> None:
        """Runs in its own thread: an abort sets the flag at once, whatever the event loop is doing."""
        with os.fdopen(self._fd_in, "rb") as stream:
            while True:
                header = stream.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    break
                (size,) = _HEADER.unpack(header)
                payload = stream.read(size)
                if len(payload) < size:
                    break
                message = pickle.loads(payload)
                kind = message[0]
                if kind == "abort":
                    _, channel, aborted, parent_time = message
                    event = self._events.setdefault(channel, threading.Event())
                    event.set() if aborted else event.clear()
                    seen = ("abort_seen", channel, aborted, parent_time, time.monotonic())
                    self._loop.call_soon_threadsafe(self._send, seen)
                elif kind == "run":
                    event = self._events.setdefault(message[2], threading.Event())
                    self._loop.call_soon_threadsafe(self._start_episode, message, event)
                elif kind == "drop":
                    self._events.pop(message[1], None)
                elif kind == "cancel":
                    self._loop.call_soon_threadsafe(self._cancel, message[1])
                elif kind == "init":
                    self._loop.call_soon_threadsafe(lambda m=message: asyncio.ensure_future(self._init(m)))
                elif kind == "stop":
                    break
        os._exit(0)  # the parent is gone or asked us to stop; the sandbox zygote dies with us

    async def _init(self, message: Any) -> None:
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
            self._send(("init_error", "config", str(exc)))
            return
        except Exception as exc:
            logger.exception("executor worker start-up failed")
            self._send(("init_error", "error", f"{type(exc).__name__}: {exc}"))
            return
        self._send(("ready", os.getpid()))

    def _start_episode(self, message: Any, event: threading.Event) -> None:
        _, episode_id, _, inputs, sampling_params, evaluation, kept = message
        self._tasks[episode_id] = asyncio.ensure_future(
            self._run_episode(episode_id, inputs, sampling_params, evaluation, event, kept)
        )

    def _cancel(self, episode_id: int) -> None:
        task = self._tasks.get(episode_id)
        if task is not None:
            task.cancel()

    async def _run_episode(
        self,
        episode_id: int,
        inputs: dict[str, Any],
        sampling_params: Any,
        evaluation: bool,
        event: Any,
        kept: dict[str, Any] | None,
    ) -> None:
        args = SimpleNamespace(**vars(self._base_args))
        args.abort_event = event
        optional = {name: inputs.pop(name) for name in OPTIONAL_SAMPLE_ATTRIBUTES if name in inputs}
        sample = self._sample_class(**inputs)
        for name, value in optional.items():
            setattr(sample, name, value)
        if kept is not None:  # an ABORTED sample that resumes: rollout's own path finds its kept part
            apply_result(sample, kept)
        try:
            config = get_rollout_config(args)
            result = await Episode(args, sample, sampling_params, evaluation, config).run()
            started = time.thread_time()
            packed = [pack_result(item) for item in (result if isinstance(result, list) else [result])]
            payload = pickle.dumps(("done", episode_id, packed), protocol=_PICKLE_PROTOCOL)
            self._transport.write(_HEADER.pack(len(payload)) + payload)
            self._send(("codec", time.thread_time() - started))
            return
        except asyncio.CancelledError:
            return
        except ConfigError as exc:
            reply = ("config_error", episode_id, str(exc))
        except Exception as exc:
            logger.exception("executor worker: episode %d failed", episode_id)
            reply = ("error", episode_id, f"{type(exc).__name__}: {exc}")
        finally:
            self._tasks.pop(episode_id, None)
        self._send(reply)


def worker_main() -> int:
    """Entry point of a worker process (``python -m strands_slime.rollout.executor``, started by the parent)."""
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
    )
    asyncio.run(_WorkerServer(fd_in, fd_out).serve())
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
