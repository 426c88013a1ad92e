"""Running the dev server for synchronous callers: in a background thread.

(``DevServerProcess``, the dev server's command line as a child process, moved to
``benchmarks/devserver_process.py``; the old name warns.)"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from strands_slime.devserver.app import DevServer
from strands_slime.devserver.moved import moved

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

    def inject_fault(self, **spec: Any) -> None:
        """Deprecated: ``inject_fault(server, ...)`` from ``benchmarks/fault_injection.py``."""
        moved("DevServerThread.inject_fault", "inject_fault")(self, **spec)

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


def __getattr__(name: str) -> Any:
    if name == "DevServerProcess":
        return moved("strands_slime.devserver.runners.DevServerProcess", name)
    raise AttributeError(f"module 'strands_slime.devserver.runners' has no attribute {name!r}")
