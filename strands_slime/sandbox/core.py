"""``Sandbox``: async front end of the zygote (and camel) backends, shared by many episodes."""

from __future__ import annotations

import array
import asyncio
import contextlib
import functools
import importlib.util
import itertools
import json
import logging
import math
import os
import signal
import site
import socket
import subprocess
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from strands_slime.runtime import get_runtime
from strands_slime.sandbox.config import SandboxConfig
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
#: Zygote messages handled per loop iteration.
MESSAGES_PER_ITERATION = 64
#: Minimum seconds between start attempts once ``max_restarts`` consecutive starts failed.
RESTART_BACKOFF_S = 10.0
_MAX_MESSAGE = 1 << 16


class SandboxError(RuntimeError):
    """The sandbox itself could not run code (zygote failed to start, died, or stopped answering)."""


class _Backend(Protocol):
    capabilities: dict[str, Any]

    async def start(self) -> None: ...

    async def execute(self, code: str, timeout_s: float, cpu_s: float) -> ExecutionResult: ...

    async def close(self) -> None: ...


class _OutputCapture:
    """Reads one pipe without blocking the loop; keeps its head and tail, counts every byte."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fd: int,
        keep_bytes: int,
        on_data: Callable[[int], None],
    ) -> None:
        self._loop = loop
        self._fd = fd
        self._tail_bytes = keep_bytes // 4
        self._head_bytes = keep_bytes - self._tail_bytes
        self._head = bytearray()
        self._tail = bytearray()
        self._on_data = on_data
        self.total = 0
        self.closed = loop.create_future()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        self.total += len(data)
        room = self._head_bytes - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data and self._tail_bytes:
            self._tail += data
            if len(self._tail) > 2 * self._tail_bytes:
                del self._tail[: len(self._tail) - self._tail_bytes]
        self._on_data(self.total)

    def close(self) -> None:
        if self._fd < 0:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
        if not self.closed.done():
            self.closed.set_result(None)

    @property
    def kept(self) -> int:
        return len(self._head) + min(len(self._tail), self._tail_bytes)

    @property
    def truncated(self) -> bool:
        return self.total > self.kept

    def text(self) -> str:
        tail = bytes(self._tail[-self._tail_bytes :]) if self._tail_bytes else b""
        if not self.truncated:
            return (bytes(self._head) + tail).decode("utf-8", errors="replace")
        omitted = self.total - len(self._head) - len(tail)
        head = bytes(self._head).decode("utf-8", errors="replace")
        return f"{head}\n[... {omitted} bytes omitted ...]\n" + tail.decode("utf-8", errors="replace")


class _StatusReader:
    """Reads the worker's one-line exit status (written just before it exits normally)."""

    _LIMIT = 4096

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, on_status: Callable[[], None]) -> None:
        self._loop = loop
        self._fd = fd
        self._buffer = bytearray()
        self._on_status = on_status
        self.status: dict[str, Any] | None = None
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self._fd, self._LIMIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self._buffer += data
        line, newline, _ = self._buffer.partition(b"\n")
        if newline:
            with contextlib.suppress(ValueError):
                status = json.loads(line)
                if isinstance(status, dict) and (
                    isinstance(status.get("exit_code"), int) or isinstance(status.get("setup_error"), str)
                ):
                    self.status = status
        if newline or not data or len(self._buffer) > self._LIMIT:
            self.close()
            if self.status is not None:
                self._on_status()

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


class _Pending:
    __slots__ = ("answer", "status", "stderr", "stdout")

    def __init__(
        self,
        answer: asyncio.Future[dict[str, Any]],
        stdout: _OutputCapture,
        stderr: _OutputCapture,
        status: _StatusReader,
    ) -> None:
        self.answer = answer
        self.stdout = stdout
        self.stderr = stderr
        self.status = status

    def close(self) -> None:
        self.stdout.close()
        self.stderr.close()
        self.status.close()


@functools.lru_cache(maxsize=16)
def importable_modules(names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` this interpreter finds (``find_spec``: nothing is imported or run)."""
    found = []
    for name in names:
        try:
            if importlib.util.find_spec(name) is not None:
                found.append(name)
        except (ImportError, ValueError):
            continue
    return found


def _site_directories() -> list[str]:
    """Where the zygote (started with -I -S) finds installed packages: the running interpreter's."""
    directories = list(site.getsitepackages())
    directories += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    seen: dict[str, None] = {}
    for directory in directories:
        if os.path.isdir(directory):
            seen.setdefault(directory)
    return list(seen)


def _launch_zygote(
    python: str, child_sock: socket.socket, environment: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Start the zygote interpreter (vfork + exec: about a millisecond, once per zygote start).

    Called on the event loop's thread on purpose: the zygote's parent-death signal is tied to the
    thread that forked it, so a worker thread that later exits would take the zygote with it.
    """
    return subprocess.Popen(
        [python, "-I", "-S", str(ZYGOTE_SCRIPT), str(child_sock.fileno()), str(os.getpid())],
        pass_fds=(child_sock.fileno(),),
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def _kill_process(process: subprocess.Popen[bytes], sock: socket.socket) -> None:
    """Synchronous last-resort cleanup (finalizer, closed event loop)."""
    with contextlib.suppress(OSError):
        sock.close()
    if process.poll() is None:
        with contextlib.suppress(OSError):
            process.kill()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            process.wait(timeout=5)


class ZygoteBackend:
    """Talks to one zygote process; restarts it when it dies."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.capabilities: dict[str, Any] = {}
        self.preloaded: list[str] = []
        self._process: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._start_lock = asyncio.Lock()
        self._pending: dict[int, _Pending] = {}
        self._send_queue: deque[tuple[bytes, list[int]]] = deque()
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
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    @property
    def alive(self) -> bool:
        return (
            self._sock is not None
            and self._ready is not None
            and self._ready.done()
            and self._process is not None
            and self._process.poll() is None
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")
        if self.alive:
            return
        async with self._start_lock:
            if self.alive:
                return
            if self._sock is not None:  # died, and the loop has not seen the socket close yet
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
        try:
            process = _launch_zygote(cfg.python_executable or sys.executable, child_sock, environment)
        except OSError as exc:
            parent_sock.close()
            raise SandboxError(f"could not start the sandbox zygote: {exc}") from exc
        finally:
            child_sock.close()
        parent_sock.setblocking(False)
        self._process = process
        self._sock = parent_sock
        self._finalizer = weakref.finalize(self, _kill_process, process, parent_sock)
        self._ready = loop.create_future()
        self._lost = asyncio.Event()
        loop.add_reader(parent_sock.fileno(), self._on_readable)
        init = {
            "op": "init",
            "config": {
                **cfg.model_dump(mode="json"),
                "preload_modules": [m for m in cfg.preload_modules if m not in self._crashed_modules],
                "max_concurrency": cfg.effective_max_concurrency,
                "site_dirs": _site_directories(),
            },
        }
        self._send(init, [])
        try:
            ready = await asyncio.wait_for(asyncio.shield(self._ready), cfg.start_timeout_s)
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
        self._closed = True
        if self._sock is None or self._process is None:
            return
        lost = self._lost
        self._send({"op": "shutdown"}, [])
        if lost is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(lost.wait(), 5.0)
        self._on_zygote_lost("sandbox closed")

    def _discard_process(self) -> None:
        if self._sock is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._sock.fileno())
            if self._send_queue:
                self._loop.remove_writer(self._sock.fileno())
        for _, fds in self._send_queue:
            for fd in fds:
                os.close(fd)
        self._send_queue.clear()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        process, sock = self._process, self._sock
        self._sock = None
        self._process = None
        if sock is not None:
            sock.close()
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError):
                process.kill()
            if self._loop is not None and not self._loop.is_closed():
                self._reap_later(process, time.monotonic() + 5.0)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(SandboxError("sandbox zygote exited during start-up"))
            self._ready.exception()  # retrieved here when nobody awaits it
        self._ready = None

    def _reap_later(self, process: subprocess.Popen[bytes], deadline: float) -> None:
        """Collect the killed zygote's exit status without waiting on the event loop."""
        if process.poll() is None and time.monotonic() < deadline and self._loop is not None:
            self._loop.call_later(0.01, self._reap_later, process, deadline)

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
        """Queue a message; takes ownership of ``fds`` (closed once sent)."""
        self._send_queue.append((json.dumps(message).encode(), fds))
        if len(self._send_queue) == 1:
            self._flush()

    def _flush(self) -> None:
        sock = self._sock
        while self._send_queue:
            payload, fds = self._send_queue[0]
            if sock is None:
                break
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            try:
                sock.sendmsg([payload], ancillary)
            except BlockingIOError:
                if self._loop is not None:
                    self._loop.add_writer(sock.fileno(), self._flush)
                return
            except OSError:
                self._loop.call_soon(self._on_zygote_lost, "sandbox zygote connection broke")  # type: ignore[union-attr]
                return
            self._send_queue.popleft()
            for fd in fds:
                os.close(fd)
        if sock is not None and self._loop is not None:
            self._loop.remove_writer(sock.fileno())

    def _on_readable(self) -> None:
        sock = self._sock
        # At most a batch per loop iteration (the socket stays readable): bounded loop blocking.
        for _ in range(MESSAGES_PER_ITERATION):
            if sock is None:
                return
            fds = array.array("i")
            try:
                data, ancillary, _, _ = sock.recvmsg(_MAX_MESSAGE, socket.CMSG_SPACE(fds.itemsize))
            except BlockingIOError:
                return
            except OSError:
                data, ancillary = b"", []
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
            if not data:
                for fd in fds:
                    os.close(fd)
                self._on_zygote_lost("sandbox zygote exited")
                return
            message = json.loads(data)
            op = message["op"]
            if op == "worker" and len(fds) == 1:
                self._on_worker(message["pid"], socket.socket(fileno=fds[0]))
            elif op == "done":
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
            else:
                for fd in fds:
                    os.close(fd)
            sock = self._sock

    # ------------------------------------------------------------------ workers
    def _on_worker(self, pid: int, worker_sock: socket.socket) -> None:
        while self._worker_waiters:
            waiter = self._worker_waiters.popleft()
            if not waiter.done():
                waiter.set_result((pid, worker_sock))
                return
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
                self._idle_workers.appendleft(waiter.result())
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
                pid, worker_sock = await asyncio.wait_for(self._acquire_worker(), self.config.start_timeout_s)
            except asyncio.TimeoutError as exc:
                raise SandboxError("no sandbox worker became available") from exc
            try:
                await self._pace(loop)
            except asyncio.CancelledError:
                self._idle_workers.appendleft((pid, worker_sock))
                raise
            call_id = next(self._ids)
            request = json.dumps({"id": call_id, "cpu_s": cpu_s}).encode()
            # The zygote hears about the call before the worker can possibly finish it.
            self._send({"op": "started", "id": call_id, "pid": pid, "timeout_s": timeout_s}, [])
            try:
                # One small message with four descriptors into an empty socket buffer: never blocks.
                worker_sock.sendmsg(
                    [request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", handed_over))]
                )
                return call_id
            except OSError as exc:
                last_error = exc
                if self._process is not None and self._process.poll() is not None:
                    self._on_zygote_lost("sandbox zygote exited")
            finally:
                worker_sock.close()
        raise SandboxError(f"sandbox workers kept dying before they got the request: {last_error}")

    async def execute(self, code: str, timeout_s: float, cpu_s: float) -> ExecutionResult:
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

        stdout = _OutputCapture(loop, stdout_read, cfg.max_output_bytes, check_output)
        stderr = _OutputCapture(loop, stderr_read, cfg.max_output_bytes, check_output)
        status = _StatusReader(loop, status_read, worker_may_be_done)
        stdout.closed.add_done_callback(worker_may_be_done)
        stderr.closed.add_done_callback(worker_may_be_done)
        answer: asyncio.Future[dict[str, Any]] = loop.create_future()
        answer.add_done_callback(zygote_answered)
        item = _Pending(answer, stdout, stderr, status)
        self._pending[call_id] = item
        try:
            source = await asyncio.wait_for(asyncio.shield(finished), timeout_s + ANSWER_GRACE_S)
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
            if self._sock is not None and call_id in self._pending:
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
        stdout: _OutputCapture,
        stderr: _OutputCapture,
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


class Sandbox:
    """Runs Python code in isolated, resource-limited processes; safe to share on one event loop.

    ``await run(code)`` never raises for problems of the code or of the sandbox: it returns an
    ``ExecutionResult`` whose ``kind`` says what happened (``INFRA`` when the sandbox broke).
    """

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._backend: _Backend
        if self.config.backend == "camel":
            from strands_slime.sandbox.camel_backend import CamelBackend

            self._backend = CamelBackend(self.config)
        else:
            self._backend = ZygoteBackend(self.config)
        self._semaphore: asyncio.Semaphore | None = None
        self._closed = False

    @property
    def capabilities(self) -> dict[str, Any]:
        """Isolation features in force (known after ``start``)."""
        return dict(self._backend.capabilities)

    @property
    def available_modules(self) -> list[str] | None:
        """The preload modules that imported in the sandbox (checked once at start-up, in the
        zygote or, for camel, in a worker thread); None before ``start``."""
        preloaded = self._backend.capabilities.get("preloaded")
        return list(preloaded) if preloaded is not None else None

    @property
    def zygote_pid(self) -> int | None:
        return self._backend.pid if isinstance(self._backend, ZygoteBackend) else None

    @property
    def closed(self) -> bool:
        return self._closed

    async def start(self) -> None:
        """Start the backend now instead of on the first ``run``. Raises ``SandboxError``."""
        if self._closed:
            raise SandboxError("sandbox is closed")
        await self._backend.start()

    async def run(self, code: str, timeout: float | None = None) -> ExecutionResult:
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, not {type(code).__name__}")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf
        ):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if self._closed:
            return ExecutionResult.failure(ResultKind.INFRA, "sandbox is closed")
        size = len(code.encode("utf-8", errors="surrogatepass"))
        if size > self.config.max_code_bytes:
            return ExecutionResult.failure(
                ResultKind.INVALID_INPUT,
                f"code is {size} bytes long; the limit is {self.config.max_code_bytes} bytes",
            )
        timeout_s = float(timeout) if timeout is not None else self.config.timeout_s
        cpu_s = self.config.cpu_time_s if self.config.cpu_time_s is not None else timeout_s
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.config.effective_max_concurrency)
        async with self._semaphore:
            return await self._backend.execute(code, timeout_s, cpu_s)

    async def close(self) -> None:
        """Shut the backend down (the zygote and its workers); later runs return an ``INFRA`` failure."""
        self._closed = True
        await self._backend.close()

    def kill(self) -> None:
        """Mark the sandbox closed and kill its zygote now, synchronously (workers die with it).

        For a sandbox whose event loop is gone or not running (``close`` needs that loop)."""
        self._closed = True
        backend = self._backend
        if isinstance(backend, ZygoteBackend) and backend._finalizer is not None:
            backend._finalizer()  # kills and reaps synchronously

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def get_shared_sandbox(config: SandboxConfig | None = None) -> Sandbox:
    """The sandbox for ``config`` on the running event loop, created on first use.

    slime runs every episode of a rollout process on one loop, so they all share one zygote.
    Sandboxes of loops that have been closed are shut down here.
    """
    config = config or SandboxConfig()
    loop = asyncio.get_running_loop()
    shared = get_runtime().sandboxes
    for other_loop, sandboxes in list(shared.items()):
        if other_loop.is_closed():
            for sandbox in sandboxes.values():
                sandbox.kill()  # that loop is gone
            del shared[other_loop]
    sandboxes = shared.setdefault(loop, {})
    key = config.model_dump_json()
    sandbox = sandboxes.get(key)
    if sandbox is None or sandbox.closed:
        sandbox = sandboxes[key] = Sandbox(config)
    return sandbox
