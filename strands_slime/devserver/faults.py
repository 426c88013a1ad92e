"""Deprecated: fault injection moved to ``benchmarks/fault_injection.py`` (not part of the package)."""

from typing import Any

from strands_slime.devserver.moved import moved


def __getattr__(name: str) -> Any:
    if name in ("Fault", "inject_fault", "set_fault_mix", "clear_faults"):
        return moved(f"strands_slime.devserver.faults.{name}", name)
    raise AttributeError(f"module 'strands_slime.devserver.faults' has no attribute {name!r}")
