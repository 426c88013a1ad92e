"""The zygote backend: one pre-started ``_zygote.py`` process per sandbox, forking a worker per call.

The event loop's thread never forks, execs or waits for a process: zygotes are started, and the
killed ones reaped, by a ``ZygoteLauncher`` thread that lives as long as the sandbox. Everything
else is non-blocking descriptor work (``pipes``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import json
import logging
import math
import os
import queue
import signal
import site
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from strands_slime.aborts import wait_for
from strands_slime.sandbox.base import SandboxError
from strands_slime.sandbox.config import SandboxConfig
from strands_slime.sandbox.pipes import ControlChannel, OutputCapture, StatusReader, send_with_fds
from strands_slime.sandbox.result import ExecutionResult, ResultKind

logger = logging.getLogger(__name__)

ZYGOTE_SCRIPT = Path(__file__).with_name("_zygote.py")
#: Seconds the front end waits beyond an execution's own limit before declaring the zygote stuck.
ANSWER_GRACE_S = 15.0
#: Seconds to wait for the output pipes to close once the zygote reported an execution finished.
EOF_GRACE_S = 2.0
#: Most seconds of call set-up done in one event-loop iteration; more calls wait for the next one,
#: so that a burst of hundreds of calls never holds the loop (its timers and I/O) for long.
SLICE_BUDGET_S = 0.002
#: Minimum seconds between start attempts once ``max_restarts`` consecutive starts failed.
RESTART_BACKOFF_S = 10.0
#: How long the launcher waits for a killed zygote to exit, and how often it looks.
REAP_TIMEOUT_S = 5.0
REAP_POLL_S = 0.02

_T = TypeVar("_T")


class ZygoteLauncher:
    """Starts zygote processes on one long-lived thread and reaps the killed ones there.

    Not on the event loop's thread: ``subprocess.Popen`` suspends the calling thread until the child
    has exec'ed (vfork) and does its bookkeeping with it, which on a saturated machine takes as long
    as the scheduler makes it. Not on a short-lived worker thread either: the zygote's parent-death
    signal fires when the *thread* that forked it exits, so this thread lives until ``stop`` (the
    sandbox's close), when the zygotes it started are gone or being killed anyway.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._dying: list[tuple[subprocess.Popen[bytes], float]] = []  # touched by the thread only

    def submit(self, function: Callable[..., _T], *args: Any) -> concurrent.futures.Future[_T]:
        """Run ``function(*args)`` on the launcher thread; its result or exception comes in the future."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def job() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function(*args))
                except BaseException as exc:  # handed to whoever awaits the future
                    future.set_exception(exc)

        self._put(job)
        return future

    def reap(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL ``process`` now and collect its exit status on the launcher thread (≤ 5 s)."""
        with contextlib.suppress(OSError):
            process.kill()
        deadline = time.monotonic() + REAP_TIMEOUT_S
        self._put(lambda: self._dying.append((process, deadline)))

    def stop(self) -> None:
        """Let the thread finish its queued jobs and reaps, then exit. Never waits."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                self._jobs.put(None)

    def _put(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():  # first use, or after a fork
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=self._serve, args=(self._jobs,), name="strands-slime-zygote-launcher", daemon=True
                )
                self._thread.start()
            self._jobs.put(job)

    def _serve(self, jobs: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        stopping = False
        while True:
            job: Callable[[], None] | None = None
            try:
                job = jobs.get(timeout=REAP_POLL_S if self._dying else None)
            except queue.Empty:
                pass
            else:
                if job is None:
                    stopping = True
                else:
                    job()
            self._collect_dying()
            if stopping and not self._dying:
                with self._lock:
                    if jobs.empty():
                        self._thread = None
                        return

    def _collect_dying(self) -> None:
        now = time.monotonic()
        still: list[tuple[subprocess.Popen[bytes], float]] = []
        for process, deadline in self._dying:
            if process.poll() is None:
                if now < deadline:
                    still.append((process, deadline))
                else:
                    logger.warning(
                        "sandbox: zygote %d did not exit within %.0f s of SIGKILL",
                        process.pid,
                        REAP_TIMEOUT_S,
                    )
        self._dying = still


def _on_running_loop() -> bool:
    """True when called from a thread that runs an event loop (which must never wait)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _site_directories() -> list[str]:
    """Where the zygote (started with -I -S) finds installed packages: the running interpreter's."""
    directories = list(site.getsitepackages())
    directories += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    seen: dict[str, None] = {}
    for directory in directories:
        if os.path.isdir(directory):
            seen.setdefault(directory)
    return list(seen)


def launch_zygote(
    python: str, child_sock: socket.socket, environment: dict[str, str]
) -> tuple[subprocess.Popen[bytes], list[str]]:
    """Start the zygote interpreter; returns it and the site directories it must add to ``sys.path``.

    Runs on the launcher thread (see ``ZygoteLauncher``); closes ``child_sock`` (the zygote has its
    own copy) whether or not the start worked. Raises ``OSError`` when the interpreter cannot start.
    """
    try:
        process = subprocess.Popen(
            [python, "-I", "-S", str(ZYGOTE_SCRIPT), str(child_sock.fileno()), str(os.getpid())],
            pass_fds=(child_sock.fileno(),),
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        child_sock.close()
    return process, _site_directories()


def _kill_zygote(process: subprocess.Popen[bytes], sock: socket.socket, launcher: ZygoteLauncher) -> None:
    """Last-resort cleanup without the event loop (finalizer, closed loop): kill now, reap on the launcher."""
    with contextlib.suppress(OSError):
        sock.close()
    launcher.reap(process)
    launcher.stop()


def _discard_launch(
    launcher: ZygoteLauncher,
    child_sock: socket.socket,
    launch: concurrent.futures.Future[tuple[subprocess.Popen[bytes], list[str]]],
) -> None:
    """A start whose caller was cancelled: kill the zygote it produced, if any.

    A launch cancelled before it ran never reached ``launch_zygote``, which closes ``child_sock``.
    """
    if launch.cancelled():
        child_sock.close()
    elif launch.exception() is None:
        launcher.reap(launch.result()[0])


@dataclass(slots=True)
class _PendingExecution:
    """An execution in flight: the zygote's ``done`` message to come, and its three pipes."""

    answer: asyncio.Future[dict[str, Any]]
    stdout: OutputCapture
    stderr: OutputCapture
    status: StatusReader

    def close(self) -> None:
        """Close all three pipes."""
        self.stdout.close()
        self.stderr.close()
        self.status.close()


class ZygoteBackend:
    """Talks to one zygote process; restarts it when it dies."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.capabilities: dict[str, Any] = {}
        self.preloaded: list[str] = []
        self._launcher = ZygoteLauncher()
        self._process: subprocess.Popen[bytes] | None = None
        self._channel: ControlChannel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._start_lock = asyncio.Lock()
        self._pending: dict[int, _PendingExecution] = {}
        self._idle_workers: deque[tuple[int, socket.socket]] = deque()
        self._worker_waiters: deque[asyncio.Future[tuple[int, socket.socket]]] = deque()
        self._ids = itertools.count(1)
        self._failed_starts = 0
        self._last_start_attempt = -math.inf
        self._closed = False
        self._finalizer: weakref.finalize | None = None
        self._lost: asyncio.Event | None = None
        self._preloading: str | None = None
        self._slice_started: float | None = None
        self._crashed_modules: list[str] = []
        self.starts = 0

    @property
    def pid(self) -> int | None:
        """The running zygote's pid, None when there is none."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    @property
    def alive(self) -> bool:
        """True when a zygote is running, started and connected."""
        return (
            self._channel is not None
            and self._ready is not None
            and self._ready.done()
            and self._process is not None
            and self._process.poll() is None
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the zygote unless one is running. Raises ``SandboxError`` when it cannot start."""
        if self._closed:
            raise SandboxError("sandbox is closed")
        if self.alive:
            return
        async with self._start_lock:
            if self.alive:
                return
            if self._channel is not None:  # died, and the loop has not seen the socket close yet
                self._on_zygote_lost("sandbox zygote exited")
            if self._failed_starts > self.config.max_restarts:
                wait = self._last_start_attempt + RESTART_BACKOFF_S - time.monotonic()
                if wait > 0:
                    raise SandboxError(
                        f"sandbox zygote failed to start {self._failed_starts} times in a row; "
                        f"next attempt in {wait:.0f} s"
                    )
            self._last_start_attempt = time.monotonic()
            while True:
                self._preloading = None
                try:
                    await self._spawn()
                    break
                except asyncio.CancelledError:  # the caller gave up (Ctrl-C, an abort): no crash, no retry
                    self._discard_process()
                    raise
                except BaseException:
                    self._discard_process()
                    crashed = self._preloading
                    if crashed is not None and crashed not in self._crashed_modules:
                        # The interpreter died importing it: start again without it.
                        logger.error("sandbox: preloading %s crashed the zygote; skipping it", crashed)
                        self._crashed_modules.append(crashed)
                        continue
                    self._failed_starts += 1
                    raise
            self._failed_starts = 0
            self.starts += 1

    async def _spawn(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        cfg = self.config
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        environment = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        python = cfg.python_executable or sys.executable
        launch = self._launcher.submit(launch_zygote, python, child_sock, environment)
        try:
            process, site_directories = await asyncio.wrap_future(launch)
        except OSError as exc:
            parent_sock.close()
            raise SandboxError(f"could not start the sandbox zygote: {exc}") from exc
        except BaseException:
            parent_sock.close()
            launch.add_done_callback(functools.partial(_discard_launch, self._launcher, child_sock))
            raise
        self._process = process
        self._finalizer = weakref.finalize(self, _kill_zygote, process, parent_sock, self._launcher)
        self._ready = loop.create_future()
        self._lost = asyncio.Event()
        self._channel = ControlChannel(loop, parent_sock, self._on_message, self._on_zygote_lost)
        init = {
            "op": "init",
            "config": {
                **cfg.model_dump(mode="json"),
                "preload_modules": [m for m in cfg.preload_modules if m not in self._crashed_modules],
                "max_concurrency": cfg.effective_max_concurrency,
                "site_dirs": site_directories,
            },
        }
        self._send(init, [])
        try:
            ready = await wait_for(asyncio.shield(self._ready), cfg.start_timeout_s)
        except asyncio.TimeoutError as exc:
            raise SandboxError(f"sandbox zygote did not start within {cfg.start_timeout_s} s") from exc
        self.capabilities = ready["capabilities"]
        self.preloaded = ready["preloaded"]
        self.capabilities["preloaded"] = ready["preloaded"]
        self.capabilities["preload_missing"] = ready["missing"]
        self.capabilities["preload_failed"] = {
            **ready["failed"],
            **{name: "the interpreter died importing it" for name in self._crashed_modules},
        }
        for warning in ready["warnings"]:
            logger.warning("sandbox: %s", warning)
        for name, error in ready["failed"].items():
            logger.warning("sandbox: preloading %s failed: %s", name, error)

    async def close(self) -> None:
        """Shut the zygote down (running executions end ``KILLED``); waits at most 5 s for it."""
        self._closed = True
        if self._channel is not None and self._process is not None:
            lost = self._lost
            self._send({"op": "shutdown"}, [])
            if lost is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await wait_for(lost.wait(), 5.0)
            self._on_zygote_lost("sandbox closed")
        self._launcher.stop()

    def kill(self) -> None:
        """Kill the zygote without its event loop (closed or not running).

        On a running event loop (another loop's sandbox) it never waits: the launcher thread reaps
        the zygote. Outside one it waits, at most 5 s, until the zygote is gone.
        """
        self._closed = True
        process = self._process
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer()  # SIGKILL now; the launcher thread reaps it, then ends
        else:
            self._launcher.stop()
        if process is not None and not _on_running_loop():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(REAP_TIMEOUT_S)

    def _discard_process(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        process, channel = self._process, self._channel
        self._channel = None
        self._process = None
        if channel is not None:
            channel.close()
        if process is not None and process.poll() is None:
            self._launcher.reap(process)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(SandboxError("sandbox zygote exited during start-up"))
            self._ready.exception()  # retrieved here when nobody awaits it
        self._ready = None

    def _on_zygote_lost(self, reason: str) -> None:
        returncode = self._process.poll() if self._process is not None else None
        if self._lost is not None:
            self._lost.set()
            self._lost = None
        self._discard_process()
        while self._idle_workers:
            self._idle_workers.popleft()[1].close()
        while self._worker_waiters:
            waiter = self._worker_waiters.popleft()
            if not waiter.done():
                waiter.set_exception(SandboxError(f"{reason} (zygote exit status {returncode})"))
                waiter.exception()
        pending, self._pending = self._pending, {}
        for item in pending.values():
            item.close()
            if not item.answer.done():
                item.answer.set_exception(SandboxError(f"{reason} (zygote exit status {returncode})"))
                item.answer.exception()  # marks it retrieved when the caller was cancelled meanwhile

    # ------------------------------------------------------------------ messaging
    def _send(self, message: dict[str, Any], fds: list[int]) -> None:
        """Queue a message to the zygote; takes ownership of ``fds`` (closed once sent)."""
        if self._channel is not None:
            self._channel.send(message, fds)
        else:
            for fd in fds:
                os.close(fd)

    def _on_message(self, message: dict[str, Any], fds: list[int]) -> None:
        op = message["op"]
        if op == "worker" and len(fds) == 1:
            self._on_worker(message["pid"], socket.socket(fileno=fds[0]))
            return
        for fd in fds:  # only a worker message carries a descriptor
            os.close(fd)
        if op == "done":
            item = self._pending.get(message["id"])
            if item is not None and not item.answer.done():
                item.answer.set_result(message)
        elif op == "worker_gone":
            for index, (pid, worker_sock) in enumerate(self._idle_workers):
                if pid == message["pid"]:
                    worker_sock.close()
                    del self._idle_workers[index]
                    break
        elif op == "preloading":
            self._preloading = message["module"]
        elif op == "ready" and self._ready is not None and not self._ready.done():
            self._preloading = None
            self._ready.set_result(message)
        elif op == "fatal":
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(
                    SandboxError(f"sandbox zygote failed to start: {message['message']}")
                )
            else:
                logger.error("sandbox: zygote gave up: %s", message["message"])

    # ------------------------------------------------------------------ workers
    def _on_worker(self, pid: int, worker_sock: socket.socket) -> None:
        while self._worker_waiters:
            waiter = self._worker_waiters.popleft()
            if not waiter.done():
                waiter.set_result((pid, worker_sock))
                return
        self._keep_idle(pid, worker_sock)

    def _keep_idle(self, pid: int, worker_sock: socket.socket, first: bool = False) -> None:
        """Pool an unused worker, up to ``prefork`` of them; beyond that, let it go.

        Workers forked on demand for calls that were cancelled meanwhile (slime's abort cancels
        hundreds at once) would otherwise stay, each an idle process holding an execution uid.
        Closing its socket ends the worker; the zygote reaps it and frees the uid.
        """
        if len(self._idle_workers) >= self.config.prefork:
            worker_sock.close()
        elif first:
            self._idle_workers.appendleft((pid, worker_sock))
        else:
            self._idle_workers.append((pid, worker_sock))

    async def _acquire_worker(self) -> tuple[int, socket.socket]:
        """A forked, isolated worker waiting for one request (asks the zygote for one if none idle)."""
        if self._idle_workers:
            return self._idle_workers.popleft()
        assert self._loop is not None
        waiter: asyncio.Future[tuple[int, socket.socket]] = self._loop.create_future()
        self._worker_waiters.append(waiter)
        self._send({"op": "spawn"}, [])
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # got one while being cancelled: keep it
                self._keep_idle(*waiter.result(), first=True)
            raise

    # ------------------------------------------------------------------ executions
    def _end_slice(self) -> None:
        self._slice_started = None

    async def _pace(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for a later loop iteration when this one already spent its set-up budget."""
        while True:
            now = time.perf_counter()
            if self._slice_started is None:
                self._slice_started = now
                loop.call_soon(self._end_slice)  # runs at the start of the next iteration
                return
            if now - self._slice_started < SLICE_BUDGET_S:
                return
            await asyncio.sleep(0)

    async def _dispatch(self, handed_over: list[int], timeout_s: float, cpu_s: float) -> int:
        """Send one request to an idle worker; returns its call id. Raises ``SandboxError``.

        A worker (or the whole zygote) that died since it was offered is replaced: up to three
        attempts, restarting the zygote if needed. Each attempt gets a new call id, so that a late
        answer about a dead worker can never be taken for the answer to the retry.
        """
        loop = asyncio.get_running_loop()
        last_error: Exception | None = None
        for _ in range(3):
            await self.start()
            if loop is not self._loop:
                raise RuntimeError("a Sandbox must be used from the event loop that started it")
            try:
                pid, worker_sock = await wait_for(self._acquire_worker(), self.config.start_timeout_s)
            except asyncio.TimeoutError as exc:
                raise SandboxError("no sandbox worker became available") from exc
            try:
                await self._pace(loop)
            except asyncio.CancelledError:
                self._keep_idle(pid, worker_sock, first=True)
                raise
            call_id = next(self._ids)
            request = json.dumps({"id": call_id, "cpu_s": cpu_s}).encode()
            # The zygote hears about the call before the worker can possibly finish it.
            self._send({"op": "started", "id": call_id, "pid": pid, "timeout_s": timeout_s}, [])
            try:
                # One small message with four descriptors into an empty socket buffer: never blocks.
                send_with_fds(worker_sock, request, handed_over)
                return call_id
            except OSError as exc:
                last_error = exc
                if self._process is not None and self._process.poll() is not None:
                    self._on_zygote_lost("sandbox zygote exited")
            finally:
                worker_sock.close()
        raise SandboxError(f"sandbox workers kept dying before they got the request: {last_error}")

    async def execute(self, code: str, timeout_s: float, cpu_s: float) -> ExecutionResult:
        """Run ``code`` in a fresh worker; never raises for the code's or the sandbox's problems."""
        started = time.monotonic()
        cfg = self.config
        loop = asyncio.get_running_loop()
        await self._pace(loop)  # a burst of calls creates its pipes over several loop iterations
        code_fd = os.memfd_create("sandbox-code", os.MFD_CLOEXEC)
        stdout_read, stdout_write = os.pipe()
        stderr_read, stderr_write = os.pipe()
        status_read, status_write = os.pipe()
        view = memoryview(code.encode("utf-8", errors="surrogatepass"))
        while view:
            view = view[os.write(code_fd, view) :]
        handed_over = [code_fd, stdout_write, stderr_write, status_write]
        try:
            call_id = await self._dispatch(handed_over, timeout_s, cpu_s)
        except SandboxError as exc:
            for fd in (stdout_read, stderr_read, status_read):
                os.close(fd)
            return ExecutionResult.failure(ResultKind.INFRA, str(exc), time.monotonic() - started)
        except BaseException:
            for fd in (stdout_read, stderr_read, status_read):
                os.close(fd)
            raise
        finally:
            for fd in handed_over:  # the worker has its own copies now
                os.close(fd)

        # Finished when the zygote reports the process gone, or (the usual, faster path) when the
        # worker has written its exit status and closed both output pipes.
        finished: asyncio.Future[str] = loop.create_future()
        output_killed = False

        def check_output(_: int) -> None:
            nonlocal output_killed
            if stdout.total + stderr.total > cfg.output_kill_bytes and not output_killed:
                output_killed = True
                self._send({"op": "kill", "id": call_id, "reason": "output"}, [])
                stdout.close()
                stderr.close()

        def worker_may_be_done(_: object = None) -> None:
            if (
                not finished.done()
                and not output_killed
                and status.status is not None
                and stdout.closed.done()
                and stderr.closed.done()
            ):
                finished.set_result("worker")

        def zygote_answered(future: asyncio.Future[dict[str, Any]]) -> None:
            if finished.done():
                return
            error = future.exception()
            if error is not None:
                finished.set_exception(error)
            else:
                finished.set_result("zygote")

        stdout = OutputCapture(loop, stdout_read, cfg.max_output_bytes, check_output)
        stderr = OutputCapture(loop, stderr_read, cfg.max_output_bytes, check_output)
        status = StatusReader(loop, status_read, worker_may_be_done)
        stdout.closed.add_done_callback(worker_may_be_done)
        stderr.closed.add_done_callback(worker_may_be_done)
        answer: asyncio.Future[dict[str, Any]] = loop.create_future()
        answer.add_done_callback(zygote_answered)
        item = _PendingExecution(answer, stdout, stderr, status)
        self._pending[call_id] = item
        try:
            source = await wait_for(asyncio.shield(finished), timeout_s + ANSWER_GRACE_S)
            if source == "zygote":
                # asyncio.wait, not wait_for(gather): a cancelled call (slime's abort) must not leave a
                # gathering future whose late exception nobody retrieves
                await asyncio.wait((stdout.closed, stderr.closed), timeout=EOF_GRACE_S)
        except asyncio.TimeoutError:
            logger.error("sandbox: zygote did not report execution %d; restarting it", call_id)
            self._on_zygote_lost("sandbox zygote stopped answering")
            return ExecutionResult.failure(
                ResultKind.INFRA, "the sandbox stopped answering", time.monotonic() - started
            )
        except SandboxError as exc:
            return ExecutionResult.failure(ResultKind.INFRA, str(exc), time.monotonic() - started)
        except asyncio.CancelledError:
            if self._channel is not None and call_id in self._pending:
                self._send({"op": "kill", "id": call_id, "reason": "cancelled"}, [])
            raise
        finally:
            self._pending.pop(call_id, None)
            item.close()
        await self._pace(loop)  # a wave of completions is also spread over loop iterations
        if source == "zygote":
            message = answer.result()
            if status.status is not None and "setup_error" in status.status:
                message["setup_error"] = status.status["setup_error"]
        else:
            message = {"op": "done", **(status.status or {})}
        return self._result(message, stdout, stderr, time.monotonic() - started, timeout_s, cpu_s)

    def _result(
        self,
        message: dict[str, Any],
        stdout: OutputCapture,
        stderr: OutputCapture,
        duration_s: float,
        timeout_s: float,
        cpu_s: float,
    ) -> ExecutionResult:
        setup_error = message.get("setup_error")
        if setup_error:
            return ExecutionResult.failure(
                ResultKind.INFRA, f"sandbox setup failed: {setup_error}", duration_s
            )
        killed = message.get("killed")
        signum = message.get("signal")
        exit_code = -signum if signum is not None else message.get("exit_code")
        used_cpu = message.get("cpu_s")
        limit_s: float | None = None
        error: str | None = None
        if killed == "output":
            kind = ResultKind.OUTPUT_LIMIT
            error = (
                f"output limit exceeded: killed after writing more than {self.config.output_kill_bytes} bytes"
            )
        elif killed == "timeout":
            kind, limit_s = ResultKind.TIMEOUT, timeout_s
        elif killed == "shutdown":
            kind, error = ResultKind.KILLED, "the sandbox was closed during the execution"
        elif signum == signal.SIGXCPU or (
            signum == signal.SIGKILL and used_cpu is not None and used_cpu >= math.ceil(cpu_s) - 0.05
        ):
            kind, limit_s = ResultKind.CPU_LIMIT, float(math.ceil(cpu_s))
        elif signum is not None:
            kind = ResultKind.KILLED
        elif exit_code == 0:
            kind = ResultKind.OK
        else:
            kind = ResultKind.ERROR
        return ExecutionResult(
            stdout=stdout.text(),
            stderr=stderr.text(),
            exit_code=exit_code,
            timed_out=kind in (ResultKind.TIMEOUT, ResultKind.CPU_LIMIT),
            truncated=stdout.truncated or stderr.truncated or kind is ResultKind.OUTPUT_LIMIT,
            duration_s=duration_s,
            kind=kind,
            cpu_s=used_cpu,
            max_rss_kb=message.get("max_rss_kb"),
            stdout_bytes=stdout.total,
            stderr_bytes=stderr.total,
            shown_bytes=stdout.kept + stderr.kept,
            limit_s=limit_s,
            error=error,
        )
