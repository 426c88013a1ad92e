"""DAPO-math scoring for ``--custom-rm-path`` (``strands_slime.reward_func``) and eval metrics.

``dapo`` is slime's reward entry point, ``math_answer`` reads and verifies the final answer, ``eval_metrics``
aggregates pass@k-style metrics over evaluation samples.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """What ``strands_slime.reward`` held when it was a module (``reward_func``, ...), with a DeprecationWarning."""
    from strands_slime._compat import moved_attribute

    return moved_attribute(__name__, name)
