"""DAPO-math scoring for ``--custom-rm-path`` (``strands_slime.reward_func``) and eval metrics.

``dapo`` is slime's reward entry point, ``math_answer`` reads and verifies the final answer, ``eval_metrics``
aggregates pass@k-style metrics over evaluation samples.
"""
