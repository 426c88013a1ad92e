"""What one sandboxed execution returns."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum


class ResultKind(str, Enum):
    """How an execution ended. Only ``INFRA`` is the sandbox's fault rather than the code's."""

    OK = "ok"
    ERROR = "error"  # non-zero exit: an exception, a syntax error, sys.exit(n)
    TIMEOUT = "timeout"  # wall-clock limit
    CPU_LIMIT = "cpu_limit"  # CPU-seconds limit
    OUTPUT_LIMIT = "output_limit"  # wrote more than output_kill_bytes
    KILLED = "killed"  # ended by a signal (segfault, out-of-memory kill, killed itself, ...)
    INVALID_INPUT = "invalid_input"  # rejected before running (e.g. code too long)
    INFRA = "infra"  # the sandbox itself failed


@dataclass(frozen=True)
class ExecutionResult:
    """Output and outcome of one execution.

    ``stdout``/``stderr`` keep the head and tail of each stream (``max_output_bytes`` in total per
    stream, with an omission marker in between); ``stdout_bytes``/``stderr_bytes`` count everything
    the code wrote and ``shown_bytes`` what was kept of both. ``exit_code`` is negative (``-signal``) when a signal ended the process and None
    when the code never ran.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_s: float
    kind: ResultKind
    cpu_s: float | None = None
    max_rss_kb: int | None = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    shown_bytes: int | None = None
    limit_s: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the code ran and exited 0."""
        return self.kind is ResultKind.OK

    @property
    def infra_failure(self) -> bool:
        """True when the sandbox itself failed (the rollout drops such samples)."""
        return self.kind is ResultKind.INFRA

    @property
    def signal_name(self) -> str | None:
        """The name of the signal that ended the process (``SIGKILL``, ...), None if none did."""
        if self.exit_code is None or self.exit_code >= 0:
            return None
        try:
            return signal.Signals(-self.exit_code).name
        except ValueError:
            return f"signal {-self.exit_code}"

    @classmethod
    def failure(cls, kind: ResultKind, error: str, duration_s: float = 0.0) -> ExecutionResult:
        """A result for code that never ran (rejected input or a broken sandbox)."""
        return cls(
            stdout="",
            stderr="",
            exit_code=None,
            timed_out=False,
            truncated=False,
            duration_s=duration_s,
            kind=kind,
            error=error,
        )
