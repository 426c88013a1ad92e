"""``Sandbox``: the async front end shared by many episodes, over the zygote (or camel) backend.

The module layout follows the seams: ``pipes`` (the wire: control socket and execution pipes),
``zygote_backend`` (the zygote process and its launcher thread), ``camel_backend``, and this front
end, which validates input, bounds concurrency and hands out one sandbox per loop and config.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from strands_slime.runtime import get_runtime
from strands_slime.sandbox.base import Backend, SandboxError
from strands_slime.sandbox.camel_backend import CamelBackend
from strands_slime.sandbox.config import SandboxConfig
from strands_slime.sandbox.ray_backend import RayBackend
from strands_slime.sandbox.result import ExecutionResult, ResultKind
from strands_slime.sandbox.zygote_backend import ZygoteBackend

__all__ = ["Sandbox", "SandboxError", "get_shared_sandbox"]


class Sandbox:
    """Runs Python code in isolated, resource-limited processes; safe to share on one event loop.

    ``await run(code)`` never raises for problems of the code or of the sandbox: it returns an
    ``ExecutionResult`` whose ``kind`` says what happened (``INFRA`` when the sandbox broke).
    """

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._backend: Backend
        if self.config.backend == "camel":
            self._backend = CamelBackend(self.config)
        elif self.config.backend == "ray":
            self._backend = RayBackend(self.config)
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
        """The zygote's pid while one runs; None before ``start``, after ``close`` and for camel."""
        return self._backend.pid

    @property
    def placements(self) -> list[Any]:
        """Where executions run when the backend is a pool of Ray actors (``ray_backend.ActorPlacement``:
        node id, pid, calls in flight, per live actor); empty for the local backends."""
        return list(getattr(self._backend, "placements", ()))

    @property
    def closed(self) -> bool:
        """True once ``close`` was called."""
        return self._closed

    async def start(self) -> None:
        """Start the backend now instead of on the first ``run``. Raises ``SandboxError``."""
        if self._closed:
            raise SandboxError("sandbox is closed")
        await self._backend.start()

    async def run(self, code: str, timeout: float | None = None) -> ExecutionResult:
        """Run ``code`` once in a fresh process and return what happened.

        Args:
            code: Python source; a final bare expression is printed (``print_last_expression``).
            timeout: Wall-clock limit in seconds for this call; default ``config.timeout_s``.

        Returns:
            The result; problems of the code or of the sandbox are its ``kind``, never exceptions.

        Raises:
            TypeError: ``code`` is not a ``str``.
            ValueError: ``timeout`` is not a positive, finite number.
        """
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
        if self._semaphore is None:  # a pool of Ray actors takes every actor's share
            limit = getattr(self._backend, "max_concurrency", None) or self.config.effective_max_concurrency
            self._semaphore = asyncio.Semaphore(limit)
        async with self._semaphore:
            return await self._backend.execute(code, timeout_s, cpu_s)

    async def close(self) -> None:
        """Stop the backend; running executions end ``KILLED``, later calls return ``INFRA``."""
        self._closed = True
        await self._backend.close()

    def kill(self) -> None:
        """Mark the sandbox closed and kill its zygote now (workers die with it).

        For a sandbox whose event loop is gone or not running (``close`` needs that loop). Called on
        a running event loop it never waits (the sandbox's launcher thread reaps the zygote); outside
        one it waits, at most 5 s, until the zygote is gone."""
        self._closed = True
        self._backend.kill()

    async def __aenter__(self) -> Sandbox:
        """Start the sandbox (``start``)."""
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Close the sandbox (``close``)."""
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
                sandbox.kill()  # that loop is gone: kill now, reap off the loop
            del shared[other_loop]
    sandboxes = shared.setdefault(loop, {})
    key = config.model_dump_json()
    sandbox = sandboxes.get(key)
    if sandbox is None or sandbox.closed:
        sandbox = sandboxes[key] = Sandbox(config)
    return sandbox
