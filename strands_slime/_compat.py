"""Module paths of earlier releases, kept working for one more release.

Launch scripts and notebooks pass dotted paths to slime (``strands_slime.metrics.log_rollout``,
``strands_slime.filters.drop_infra_failures_and_zero_std``, ...) that the move into ``provider/``,
``rollout/`` and ``reward/`` broke. :data:`MOVED` maps each old module path to where it lives now; an
import of an old path gets the new module itself (the same object, so state is never duplicated) and
one ``DeprecationWarning`` per path and process naming the new path. The finder runs first (so that
``strands_slime.math_answer.judge`` is not found again as a second copy under the old package's path)
and answers only for the names in :data:`MOVED`: one dict lookup for any other import.

``strands_slime.rollout`` and ``strands_slime.reward`` were modules before they became packages; their
old attributes (``strands_slime.rollout.generate``, ``strands_slime.reward.reward_func``, ...) are
forwarded by :func:`moved_attribute` from the packages' ``__getattr__``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType
from typing import Any

from strands_slime.runtime import get_runtime

_PROVIDER = ("chat", "chat_families", "client", "client_errors", "constraints", "limits",
             "model", "template_check", "tokenizer", "tool_parsers", "trajectory")  # fmt: skip
_ROLLOUT = ("executor", "executor_worker", "fanout", "filters", "metrics", "offline", "resume",
            "slime_compat", "startup", "pacing")  # fmt: skip

MOVED: dict[str, str] = {
    **{f"strands_slime.{name}": f"strands_slime.provider.{name}" for name in _PROVIDER},
    **{f"strands_slime.{name}": f"strands_slime.rollout.{name}" for name in _ROLLOUT},
    "strands_slime.eval_metrics": "strands_slime.reward.eval_metrics",
    "strands_slime.math_answer": "strands_slime.reward.math_answer",
    "strands_slime.math_answer.judge": "strands_slime.reward.math_answer.judge",
    "strands_slime.math_answer.normalize": "strands_slime.reward.math_answer.normalize",
    "strands_slime.math_answer.verify": "strands_slime.reward.math_answer.verify",
    "strands_slime.rollout.episode_metadata": "strands_slime.episode_metadata",
    "strands_slime.deepseek_v32": "strands_slime.provider.deepseek",
    "strands_slime.provider.deepseek_v32": "strands_slime.provider.deepseek",
}
"""Old module path -> current module path."""

MOVED_ATTRIBUTES: dict[str, dict[str, str]] = {
    "strands_slime.rollout": {
        **dict.fromkeys(
            (
                "generate",
                "Episode",
                "EpisodeOutcome",
                "GC_THRESHOLDS",
                "tune_gc_once",
                "get_client",
                "get_tokenizer",
                "warm_up",
                "reset_attempt",
                "prepare_resume",
                "SAMPLE_RESULT_FIELDS",
                "RESUME_FIELDS",
                "STICKY_ROUTER_POLICIES",
            ),
            "strands_slime.rollout.episode",
        ),
    },
    "strands_slime.reward": dict.fromkeys(
        (
            "reward_func",
            "preset_reward",
            "compute_reward",
            "reward_details",
            "scoring_text",
            "shape_reward",
            "INFRA_FAILURE_REASON",
        ),
        "strands_slime.reward.dapo",
    ),
}
"""For the packages that were modules: old attribute -> the module that holds it now."""


def _warn(old: str, new: str) -> None:
    if get_runtime().first_time(f"deprecated path: {old}"):
        warnings.warn(
            f"{old} is deprecated and will be removed in the next release; use {new}",
            DeprecationWarning,
            stacklevel=4,
        )


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the current module itself."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        _warn(spec.name, self.target)
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the current module already ran."""

    def get_code(self, fullname: str) -> CodeType | None:
        """``python -m <old path>`` runs what ``python -m <new path>`` runs."""
        target = importlib.util.find_spec(self.target)
        if target is None or target.loader is None:
            return None
        if target.submodule_search_locations is not None:  # a package: its __main__
            target = importlib.util.find_spec(f"{self.target}.__main__")
            if target is None or target.loader is None:
                return None
        return target.loader.get_code(target.name)  # type: ignore[attr-defined]


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old module paths of :data:`MOVED` (before every other finder)."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec whose loader yields the current module, for an old path; None for anything else."""
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    """Serve the old module paths (once per process; the package's ``__init__`` calls it)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())


def moved_attribute(package: str, name: str) -> Any:
    """An attribute of a package that was a module (its ``__getattr__``), with a DeprecationWarning.

    Raises:
        AttributeError: ``name`` was never an attribute of the old module.
    """
    home = MOVED_ATTRIBUTES.get(package, {}).get(name)
    if home is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    _warn(f"{package}.{name}", f"{home}.{name}")
    return getattr(importlib.import_module(home), name)
