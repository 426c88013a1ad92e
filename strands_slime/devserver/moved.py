"""Names that left the package: fault injection, the thread and subprocess runners and the reference
logprobs are test tools now (``benchmarks/`` in the repository). The old names warn and, in a checkout, still work."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

MOVED = dict.fromkeys(
    ("Fault", "FaultProxy", "inject_fault", "set_fault_mix", "clear_faults"), "benchmarks.fault_injection"
)
MOVED |= dict.fromkeys(("DevServerProcess", "DevServerThread"), "benchmarks.devserver_runners")
MOVED |= dict.fromkeys(
    ("full_forward_logprobs", "scripted_output_logprobs"), "benchmarks.devserver_reference"
)


def moved(old: str, name: str) -> Any:
    """``name`` from its new module, with a :class:`DeprecationWarning` naming the place (``old`` is how
    the caller reached it).

    Raises:
        ImportError: not run from a checkout of the repository (the new module is not installed).
    """
    where = MOVED[name]
    place = f"{where.replace('.', '/')}.py in the strands-slime repository"
    warnings.warn(
        f"{old} moved out of the package to {place} ({where}.{name}); import it from there",
        DeprecationWarning,
        stacklevel=3,
    )
    try:
        return getattr(importlib.import_module(where), name)
    except ImportError as exc:
        raise ImportError(f"{old} moved to {place}: run from a checkout of the repository") from exc


def module_getattr(module: str, *names: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of a module whose ``names`` moved: each warns (:func:`moved`) and still works."""

    def getattr_(name: str) -> Any:
        if name in names:
            return moved(f"{module}.{name}", name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return getattr_
