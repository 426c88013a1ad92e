"""The Strands tool ``execute_python_code`` on top of a ``Sandbox``.

:func:`format_result` writes what the model reads: stdout, then ``[stderr]`` and stderr, then a last
line saying how the run ended when it was not a clean exit (``[exit code N]``, ``[timed out after
10 s]``, ...); a clean run without output says ``[no output]``. Every form: docs/sandbox.md, "What the
model reads".
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from strands.tools.tools import PythonAgentTool
from strands.types.tools import AgentTool, ToolResult, ToolSpec, ToolUse

from strands_slime.aborts import AbortedError, run_abortable
from strands_slime.sandbox.base import importable_modules
from strands_slime.sandbox.core import Sandbox
from strands_slime.sandbox.result import ExecutionResult, ResultKind

TOOL_NAME = "execute_python_code"


@dataclass
class ToolStats:
    """Per-episode counters of ``execute_python_code`` calls.

    ``errors`` counts runs of the model's code that failed (exception, non-zero exit, crash, output
    flood, rejected input), ``timeouts`` runs stopped by the wall-clock or CPU limit, and
    ``infra_failures`` calls where the sandbox itself broke; the rollout treats those differently
    from the model's own bad code. ``seconds`` is total sandbox wall time.
    """

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    infra_failures: int = 0
    seconds: float = 0.0

    def record(self, result: ExecutionResult) -> None:
        """Count one call and its outcome."""
        self.calls += 1
        self.seconds += result.duration_s
        if result.kind is ResultKind.INFRA:
            self.infra_failures += 1
        elif result.kind in (ResultKind.TIMEOUT, ResultKind.CPU_LIMIT):
            self.timeouts += 1
        elif result.kind is not ResultKind.OK:
            self.errors += 1


def _limit_text(seconds: float | None) -> str:
    if seconds is None:
        return "the limit"
    return f"{seconds:g} s"


def format_result(result: ExecutionResult) -> str:
    """The compact text the model reads for one execution (see the module docstring)."""
    parts: list[str] = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if result.truncated and result.kind is not ResultKind.OUTPUT_LIMIT:
        total = result.stdout_bytes + result.stderr_bytes
        shown = result.shown_bytes if result.shown_bytes is not None else total
        parts.append(f"[output truncated: {shown} of {total} bytes shown]")
    kind = result.kind
    if kind is ResultKind.OK:
        if not parts:
            parts.append("[no output]")
    elif kind is ResultKind.ERROR:
        parts.append(f"[exit code {result.exit_code}]")
    elif kind is ResultKind.TIMEOUT:
        parts.append(f"[timed out after {_limit_text(result.limit_s)}]")
    elif kind is ResultKind.CPU_LIMIT:
        parts.append(f"[CPU time limit of {_limit_text(result.limit_s)} exceeded]")
    elif kind is ResultKind.KILLED:
        reason = result.error or f"killed by signal {result.signal_name or result.exit_code}"
        parts.append(f"[{reason}]")
    elif kind is ResultKind.OUTPUT_LIMIT:
        parts.append(f"[{result.error or 'output limit exceeded'}]")
    elif kind is ResultKind.INVALID_INPUT:
        parts.append(f"[rejected: {result.error}]")
    else:
        parts.append(f"[sandbox error: {result.error}]")
    return "\n".join(parts)


def _available_modules(sandbox: Sandbox) -> list[str]:
    """What the sandbox imported at start-up; before ``start``, what this interpreter can find
    (cached per process), or nothing when the sandbox runs another interpreter."""
    available = sandbox.available_modules
    if available is not None:
        return available
    cfg = sandbox.config
    if cfg.backend == "zygote" and cfg.python_executable not in (None, sys.executable):
        return []
    return importable_modules(tuple(cfg.preload_modules))


def _modules_sentence(modules: list[str]) -> str:
    if not modules:
        return ""
    names = modules[0] if len(modules) == 1 else f"{', '.join(modules[:-1])} and {modules[-1]}"
    return f"{names} {'is' if len(modules) == 1 else 'are'} available. "


def _description(sandbox: Sandbox) -> str:
    cfg = sandbox.config
    network = "no network access" if cfg.network != "allow" else "network access"
    return (
        "Run Python 3 code in a fresh sandboxed process and return what it prints (stdout, then "
        "stderr). Nothing persists between calls: define everything you use in each call. "
        "The value of a final bare expression is printed, as in a REPL. "
        f"{_modules_sentence(_available_modules(sandbox))}"
        f"Limits: {cfg.timeout_s:g} s wall clock, {cfg.memory_mb} MB memory, "
        f"{cfg.max_output_bytes} bytes of output per stream, {network}."
    )


def create_python_tool(
    sandbox: Sandbox, *, stats: ToolStats | None = None, abort_check: Callable[[], bool] | None = None
) -> AgentTool:
    """The async Strands tool ``execute_python_code(code: str)`` running code in ``sandbox``.

    Its description names only the preload modules the sandbox can import: start the sandbox
    first (``await sandbox.start()``) so that this comes from the sandbox itself.

    It never raises into Strands for problems of the code or of the sandbox: every call returns a
    readable tool result (status ``error`` for anything but a clean run) and updates ``stats``.
    ``abort_check`` (slime's abort flag): once it is true a running call is stopped within ~50 ms
    (its worker is killed), so an aborted rollout does not wait for the code's own timeout.
    """
    spec: ToolSpec = {
        "name": TOOL_NAME,
        "description": _description(sandbox),
        "inputSchema": {
            "json": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "Python 3 source code to run."},
                },
                "required": ["code"],
            }
        },
    }

    async def execute_python_code(tool_use: ToolUse, **_: Any) -> ToolResult:
        tool_input = tool_use.get("input")
        code = tool_input.get("code") if isinstance(tool_input, dict) else None
        if not isinstance(code, str):
            result = ExecutionResult.failure(
                ResultKind.INVALID_INPUT,
                f"the tool input must be an object with a string field 'code', got {tool_input!r:.200}",
            )
        else:
            try:
                result = await run_abortable(sandbox.run(code), abort_check, "the tool call")
            except AbortedError:
                return {
                    "toolUseId": tool_use["toolUseId"],
                    "status": "error",
                    "content": [{"text": "the rollout was aborted: the code was stopped"}],
                }
        if stats is not None:
            stats.record(result)
        return {
            "toolUseId": tool_use["toolUseId"],
            "status": "success" if result.ok else "error",
            "content": [{"text": format_result(result)}],
        }

    return PythonAgentTool(TOOL_NAME, spec, execute_python_code)
