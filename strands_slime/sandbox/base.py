"""What the sandbox's backends share: the backend interface, its error, the module probe.

Both backends (``zygote_backend``, ``camel_backend``) import from here and nothing imports them
back except the front end (``core``), so the modules form no cycle.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any, Protocol

from strands_slime.sandbox.result import ExecutionResult


class SandboxError(RuntimeError):
    """The sandbox itself could not run code (zygote failed to start, died, or stopped answering)."""


class SandboxMisconfigured(SandboxError):
    """The sandbox cannot run as configured here (its backend's package or cluster is missing): every
    call would fail the same way, so the rollout stops at start-up."""


class Backend(Protocol):
    """What ``Sandbox`` needs from a backend."""

    #: Isolation features in force and preload results; filled in by ``start``.
    capabilities: dict[str, Any]

    @property
    def pid(self) -> int | None:
        """The backend's long-lived process, if it has one."""
        ...

    async def start(self) -> None:
        """Get ready to execute code. Raises ``SandboxError``."""
        ...

    async def execute(self, code: str, timeout_s: float, cpu_s: float) -> ExecutionResult:
        """Run ``code`` once; problems of the code or of the backend come back as the result."""
        ...

    async def close(self) -> None:
        """Stop everything the backend started."""
        ...

    def kill(self) -> None:
        """Stop without the event loop (the loop it ran on is closed); must not block."""
        ...


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
