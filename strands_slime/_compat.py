"""Module paths of earlier releases, kept working for one more release.

Launch scripts and notebooks pass dotted paths to slime (``strands_slime.metrics.log_rollout``,
``strands_slime.filters.drop_infra_failures_and_zero_std``, ...) that the move into ``provider/``,
``rollout/`` and ``reward/`` broke. Each old path is a module of two lines at its old place that calls
:func:`moved_module`; ``strands_slime.rollout`` and ``strands_slime.reward``, modules before they became
packages, forward their old attributes from their ``__getattr__``. Either way the user gets the current
object and one ``DeprecationWarning`` per path and process naming the new place; nothing is installed
in the import system.
"""

from __future__ import annotations

import functools
import importlib
import runpy
import sys
import warnings

from strands_slime.runtime import get_runtime


def warn_moved(old: str, new: str, stacklevel: int = 3) -> None:
    """One ``DeprecationWarning`` per process for ``old``, naming ``new``, at the caller's caller."""
    if get_runtime().first_time(f"deprecated path: {old}"):
        warnings.warn(
            f"{old} is deprecated and will be removed in the next release; use {new}",
            DeprecationWarning,
            stacklevel=stacklevel,
        )


def moved_module(name: str, new: str) -> None:
    """Called by the module at an old path (``name``) as it is imported: it becomes the module at ``new``
    (the same object, so no state is duplicated). An old package stays a package of its own (its old
    submodules are modules of their own under it) whose attributes are the new package's, and
    ``python -m <old path>`` runs what ``python -m <new path>`` runs."""
    module = sys.modules[name]
    old = module.__spec__.name if module.__spec__ is not None else name  # "__main__" under -m
    warn_moved(old.removesuffix(".__main__"), new.removesuffix(".__main__"), stacklevel=4)  # the importer
    if name == "__main__":
        runpy.run_module(new, run_name="__main__", alter_sys=True)
        return
    current = importlib.import_module(new)
    if hasattr(module, "__path__"):
        module.__getattr__ = functools.partial(getattr, current)  # type: ignore[attr-defined]
        module.__all__ = getattr(current, "__all__", [])
    else:
        sys.modules[name] = current
