"""Optional backend: camel-ai's ``SubprocessInterpreter``, for parity with slime's strands example.

No isolation, no limits; camel's API is synchronous, so each call holds one thread of a pool sized to
``max_concurrency``, and its single output string is split back into stdout, stderr and exit code.
camel copies ``os.environ`` into each child, so camel's module gets a ``subprocess`` whose ``Popen``
passes :func:`~strands_slime.sandbox.environment.scrubbed` environments (no other module sees it).
The children still run as the same user and can read the parent's secrets elsewhere, so the backend
refuses to start while any is within reach (:func:`~strands_slime.sandbox.environment.secrets_in_reach`).
See docs/sandbox.md, "Isolation".
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

from strands_slime.sandbox.base import SandboxError, importable_modules
from strands_slime.sandbox.config import SandboxConfig
from strands_slime.sandbox.environment import scrubbed, secrets_in_reach
from strands_slime.sandbox.result import ExecutionResult, ResultKind

_RETURN_CODE = re.compile(r"\(Execution failed with return code (-?\d+)\)$")
_TIMED_OUT = re.compile(r"Process timed out after \d+ seconds and was terminated\.")


def _truncate(text: str, limit: int) -> tuple[str, int]:
    """``text`` cut to its head and tail within ``limit`` bytes, and the bytes kept."""
    data = text.encode("utf-8", errors="surrogatepass")
    if len(data) <= limit:
        return text, len(data)
    tail_bytes = limit // 4
    head = data[: limit - tail_bytes].decode("utf-8", errors="replace")
    tail = data[len(data) - tail_bytes :].decode("utf-8", errors="replace")
    return f"{head}\n[... {len(data) - limit} bytes omitted ...]\n{tail}", limit


def parse_camel_output(output: str) -> tuple[str, str, int]:
    """Split camel's ``stdout(stderr: ...)(Execution failed with return code N)`` string."""
    exit_code = 0
    match = _RETURN_CODE.search(output)
    if match:
        exit_code = int(match.group(1))
        output = output[: match.start()]
    stdout, marker, stderr = output.partition("(stderr: ")
    if marker:
        stderr = stderr[:-1] if stderr.endswith(")") else stderr
        if not match and stderr:
            exit_code = 0
    return stdout, stderr, exit_code


class _ScrubbedSubprocess:
    """``subprocess`` as camel's interpreter module sees it: ``Popen`` never passes a secret on."""

    _strands_slime_scrubbed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, env: Any = None, **kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen`` with the environment (``os.environ`` when not given) scrubbed."""
        return subprocess.Popen(*args, env=scrubbed(os.environ if env is None else env), **kwargs)


def scrub_camel_environment(module: ModuleType) -> None:
    """Make camel's interpreter module start its children with scrubbed environments (idempotent)."""
    if not getattr(module.subprocess, "_strands_slime_scrubbed", False):
        module.subprocess = _ScrubbedSubprocess()


class CamelBackend:
    """Runs code with camel's SubprocessInterpreter in a thread pool (no isolation)."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.capabilities: dict[str, Any] = {"backend": "camel", "isolation": "none"}
        self._executor: ThreadPoolExecutor | None = None

    @property
    def pid(self) -> None:
        """camel keeps no long-lived process."""
        return None

    async def start(self) -> None:
        """Create the thread pool. Raises ``SandboxError`` when camel-ai is not installed."""
        if self._executor is None:
            try:
                from camel.interpreters import subprocess_interpreter
            except ImportError as exc:
                raise SandboxError(
                    "the camel backend needs camel-ai: pip install 'strands-slime[camel]'"
                ) from exc
            if not isinstance(
                getattr(subprocess_interpreter, "subprocess", None), ModuleType | _ScrubbedSubprocess
            ):
                raise SandboxError(
                    "this camel-ai version does not start code through its module's subprocess: "
                    "its environment could not be scrubbed of secrets"
                )
            reachable = secrets_in_reach()
            if reachable:
                raise SandboxError(
                    "the camel backend runs model code unisolated as this user, so it could read "
                    f"{', '.join(reachable)} (through /proc/<pid>/environ and the files themselves); "
                    "use the zygote backend, or remove these from this node's environment and home"
                )
            scrub_camel_environment(subprocess_interpreter)
            self._executor = ThreadPoolExecutor(
                max_workers=self.config.effective_max_concurrency, thread_name_prefix="camel-sandbox"
            )
            # camel runs code with this interpreter's packages: report those it can import
            self.capabilities["preloaded"] = await asyncio.to_thread(
                importable_modules, self.config.preload_modules
            )

    def _run_blocking(self, code: str, timeout_s: float) -> str:
        from camel.interpreters import SubprocessInterpreter

        interpreter = SubprocessInterpreter(
            require_confirm=False,
            print_stdout=False,
            print_stderr=False,
            execution_timeout=max(1, round(timeout_s)),
        )
        return interpreter.run(code, "python")

    async def execute(self, code: str, timeout_s: float, cpu_s: float) -> ExecutionResult:
        """Run ``code`` with camel on a pool thread; camel's failures come back as ``INFRA``."""
        del cpu_s  # camel has no CPU limit
        started = time.monotonic()
        try:
            await self.start()
        except Exception as exc:
            return ExecutionResult.failure(ResultKind.INFRA, str(exc))
        loop = asyncio.get_running_loop()
        try:
            output = await loop.run_in_executor(self._executor, self._run_blocking, code, timeout_s)
        except Exception as exc:  # camel raises InterpreterError for its own failures
            return ExecutionResult.failure(
                ResultKind.INFRA,
                f"camel interpreter failed: {type(exc).__name__}: {exc}",
                time.monotonic() - started,
            )
        duration = time.monotonic() - started
        stdout, stderr, exit_code = parse_camel_output(output)
        timed_out = bool(_TIMED_OUT.search(stderr))
        stdout_bytes = len(stdout.encode("utf-8", errors="surrogatepass"))
        stderr_bytes = len(stderr.encode("utf-8", errors="surrogatepass"))
        stdout, stdout_kept = _truncate(stdout, self.config.max_output_bytes)
        stderr, stderr_kept = _truncate(stderr, self.config.max_output_bytes)
        if timed_out:
            kind = ResultKind.TIMEOUT
        elif exit_code < 0:
            kind = ResultKind.KILLED
        elif exit_code:
            kind = ResultKind.ERROR
        else:
            kind = ResultKind.OK
        return ExecutionResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=exit_code,
            timed_out=timed_out,
            truncated=stdout_kept < stdout_bytes or stderr_kept < stderr_bytes,
            duration_s=duration,
            kind=kind,
            stdout_bytes=stdout_bytes,
            stderr_bytes=stderr_bytes,
            shown_bytes=stdout_kept + stderr_kept,
            limit_s=timeout_s if timed_out else None,
        )

    async def close(self) -> None:
        """Shut the thread pool down once its running calls finished (off the loop)."""
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.to_thread(executor.shutdown, wait=True)

    def kill(self) -> None:
        """Shut the thread pool down without waiting (the event loop is gone)."""
        if self._executor is not None:
            executor, self._executor = self._executor, None
            executor.shutdown(wait=False, cancel_futures=True)
