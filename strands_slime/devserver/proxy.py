"""Deprecated: ``FaultProxy`` moved to ``benchmarks/fault_injection.py`` (not part of the package)."""

from typing import Any

from strands_slime.devserver.moved import moved


def __getattr__(name: str) -> Any:
    if name == "FaultProxy":
        return moved("strands_slime.devserver.proxy.FaultProxy", name)
    raise AttributeError(f"module 'strands_slime.devserver.proxy' has no attribute {name!r}")
