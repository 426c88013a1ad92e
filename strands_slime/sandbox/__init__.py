"""Sandboxed Python execution for tool-using rollouts.

``Sandbox`` runs model-written code in a fresh, isolated process per call (forked from a
pre-started zygote that has numpy and sympy loaded); ``create_python_tool`` wraps it as the
Strands tool ``execute_python_code``. See docs/sandbox.md.
"""

from __future__ import annotations

from typing import Any

from strands_slime.sandbox.config import SandboxConfig

_LAZY = {
    "Sandbox": ("strands_slime.sandbox.core", "Sandbox"),
    "SandboxError": ("strands_slime.sandbox.base", "SandboxError"),
    "get_shared_sandbox": ("strands_slime.sandbox.core", "get_shared_sandbox"),
    "ExecutionResult": ("strands_slime.sandbox.result", "ExecutionResult"),
    "ResultKind": ("strands_slime.sandbox.result", "ResultKind"),
    "create_python_tool": ("strands_slime.sandbox.tool", "create_python_tool"),
    "format_result": ("strands_slime.sandbox.tool", "format_result"),
    "ToolStats": ("strands_slime.sandbox.tool", "ToolStats"),
}

__all__ = ["SandboxConfig", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'strands_slime.sandbox' has no attribute {name!r}")
