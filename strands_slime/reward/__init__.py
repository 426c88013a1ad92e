"""DAPO-math scoring for ``--custom-rm-path`` (``strands_slime.reward_func``) and eval metrics.

``dapo`` is slime's reward entry point, ``math_answer`` reads and verifies the final answer, ``eval_metrics``
aggregates pass@k-style metrics over evaluation samples.
"""

from typing import Any

_MOVED = ("reward_func", "preset_reward", "compute_reward", "reward_details", "scoring_text", "shape_reward",
          "INFRA_FAILURE_REASON")  # fmt: skip


def __getattr__(name: str) -> Any:
    """What ``strands_slime.reward`` held when it was a module (``reward_func``, ...), with a DeprecationWarning."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from strands_slime._compat import warn_moved
    from strands_slime.reward import dapo

    warn_moved(f"{__name__}.{name}", f"{dapo.__name__}.{name}")
    return getattr(dapo, name)
