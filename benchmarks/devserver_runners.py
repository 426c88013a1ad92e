"""Running the dev server for synchronous callers, for tests and benchmarks: in a background thread
(``DevServerThread``) or as a child process (``DevServerProcess``).

Not part of the package, which runs its dev server in-process (``async with DevServer(...)``) or from the
command line (``strands-slime serve``); ``strands_slime.devserver.DevServerThread`` and
``DevServerProcess`` warn and name this module.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from strands_slime.devserver import DevServer
from strands_slime.devserver.cli import URL_LINE_PREFIX

T = TypeVar("T")


class DevServerThread:
    """A :class:`DevServer` on its own event loop in a daemon thread: ``with DevServerThread(...) as s``.

    Takes the same arguments as :class:`DevServer`. Test hooks are forwarded thread-safely.
    """

    def __init__(self, backend: Any = "scripted", *, start_timeout: float = 120.0, **options: Any) -> None:
        self._backend = backend
        self._options = options
        self._start_timeout = start_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.server: DevServer | None = None
        self.url = ""

    def start(self) -> DevServerThread:
        """Start the server thread and wait until it serves (``start_timeout`` at most)."""
        if self._thread is not None:
            raise RuntimeError("this DevServerThread is already started")
        started: concurrent.futures.Future[DevServer] = concurrent.futures.Future()
        loop = asyncio.new_event_loop()
        self._loop = loop

        def main() -> None:
            asyncio.set_event_loop(loop)
            server = DevServer(self._backend, **self._options)
            try:
                loop.run_until_complete(server.start())
            except BaseException as exc:
                started.set_exception(exc)
                loop.close()
                return
            started.set_result(server)
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(server.stop())
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=main, name="devserver", daemon=True)
        self._thread.start()
        self.server = started.result(timeout=self._start_timeout)
        self.url = self.server.url
        return self

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the server's loop and return its result."""
        assert self._loop is not None
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return future.result(timeout=30)

    @property
    def request_log(self) -> list[dict[str, Any]]:
        """The server's request log (:attr:`DevServer.request_log`), read on its loop."""
        assert self.server is not None
        server = self.server
        return self.call(lambda: server.request_log)

    def clear_request_log(self) -> None:
        """Forget the logged requests."""
        assert self.server is not None
        self.call(self.server.clear_request_log)

    def stop(self) -> None:
        """Stop the server and join its thread (30 s at most)."""
        if self._loop is None or self._thread is None:
            return
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._thread = None

    def __enter__(self) -> DevServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DevServerProcess:
    """``python -m strands_slime.devserver ARGS --port 0`` as a child process: ``with DevServerProcess([...])``.

    Ready once it prints its URL line (after it started serving); killed on exit.
    """

    def __init__(
        self, args: Sequence[str] = (), *, start_timeout: float = 60.0, command: Sequence[str] | None = None
    ) -> None:
        self.command = list(command) if command is not None else ["-m", "strands_slime.devserver"]
        """What follows the interpreter (``["benchmarks/fault_injection.py"]`` serves with faults)."""
        self.args = list(args)
        if "--port" not in self.args and not any(arg.startswith("--port=") for arg in self.args):
            self.args += ["--port", "0"]
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[str] | None = None
        self.url = ""
        self._stderr = tempfile.TemporaryFile("w+")

    def start(self) -> DevServerProcess:
        """Spawn the process and wait for its URL line (``start_timeout`` at most)."""
        if self.process is not None:
            raise RuntimeError("this DevServerProcess is already started")
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        process = self.process = subprocess.Popen(
            [sys.executable, *self.command, *self.args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env={**env, **os.environ, "PYTHONUNBUFFERED": "1"},
        )
        printed = threading.Event()

        def read_url() -> None:
            assert process.stdout is not None
            for line in process.stdout:  # read to the end, so the child never blocks on a full pipe
                if line.startswith(URL_LINE_PREFIX) and not self.url:
                    self.url = line[len(URL_LINE_PREFIX) :].strip()
                    printed.set()
            printed.set()

        threading.Thread(target=read_url, name="devserver-stdout", daemon=True).start()
        if not printed.wait(self.start_timeout) or not self.url:
            code = process.poll()
            self.stop()
            what = (
                f"exited with code {code}"
                if code is not None
                else f"printed no URL in {self.start_timeout} s"
            )
            raise RuntimeError(f"the dev server {what}: {self.stderr_tail}")
        return self

    def stop(self) -> None:
        """Terminate the process (kill it after 10 s)."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    @property
    def stderr_tail(self) -> str:
        """The last 50 lines the process wrote to stderr."""
        self._stderr.seek(0)
        return "".join(self._stderr.readlines()[-50:])

    def __enter__(self) -> DevServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> DevServerProcess:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)
