"""Rollout metrics for slime's logging: aggregates of the per-sample metadata ``generate`` writes.

``--custom-rollout-log-function-path strands_slime.rollout.metrics.log_rollout`` and
``--custom-eval-rollout-log-function-path strands_slime.rollout.metrics.log_eval_rollout`` add our metrics
(``rollout/strands/*`` and ``eval/strands/<name>/*``, on slime's step axes) and return False, so
slime's own logging still runs.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from statistics import fmean
from typing import Any

from strands_slime.aborts import abort_check_failures
from strands_slime.episode_metadata import ANY, MAX, MEAN, TOTAL, MetricSpec, metric_specs
from strands_slime.rollout import slime_compat

logger = logging.getLogger(__name__)

# always logged, as 0.0 when absent: a metric that disappears is a gap in W&B's charts, not a zero
_STATUSES = ("completed", "truncated", "aborted", "failed")


def _flatten(samples: Iterable[Any]) -> list[Any]:
    flat: list[Any] = []
    for item in samples:
        if isinstance(item, (list, tuple)):
            flat.extend(_flatten(item))
        else:
            flat.append(item)
    return flat


def _number(value: Any) -> float | None:
    """A metadata value as a number, or None (absent, text, or a flag)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _key_metrics(key: str, spec: MetricSpec, metas: list[Mapping[str, Any]]) -> dict[str, float]:
    """The metrics one metadata key feeds (see :class:`~strands_slime.episode_metadata.MetricSpec`)."""
    n = len(metas)
    metrics: dict[str, float] = {}
    numbers = [v for v in (_number(m.get(key)) for m in metas) if v is not None]
    for aggregate in spec.aggregates:
        if aggregate == MEAN:
            value = fmean(numbers) if numbers else 0.0
        elif aggregate == MAX:
            value = max(numbers) if numbers else 0.0
        elif aggregate == ANY:
            value = sum(1 for m in metas if m.get(key)) / n
        elif aggregate == TOTAL:
            value = float(sum(numbers))
        else:
            raise ValueError(f"unknown aggregate {aggregate!r} for metadata key {key!r}")
        metrics[f"{key}/{aggregate}"] = value
    if spec.shares is not None:
        values = [m.get(key) if m.get(key) not in (None, "") else spec.missing for m in metas]
        counts = Counter(str(v) for v in values if v is not None)
        for value in sorted({*spec.shares, *counts}):
            metrics[f"{key}/{value}"] = counts[value] / n
    if spec.count_as:
        metrics[spec.count_as] = float(sum(1 for m in metas if m.get(key)))
    if spec.ratio:
        name, denominator_key = spec.ratio
        denominator = sum(_number(m.get(denominator_key)) or 0.0 for m in metas)
        metrics[name] = sum(numbers) / denominator if denominator else 0.0
    return metrics


def compute_rollout_metrics(samples: Iterable[Any]) -> dict[str, float]:
    """Means, rates and counts over the samples' metadata (keys without a prefix).

    Which keys feed which metrics is declared once, in :class:`~strands_slime.episode_metadata.EpisodeMetadata`.
    """
    flat = _flatten(samples)
    if not flat:
        return {}
    metas: list[Mapping[str, Any]] = [getattr(s, "metadata", None) or {} for s in flat]
    n = len(flat)
    metrics: dict[str, float] = {"samples": float(n)}
    for key, spec in metric_specs().items():
        metrics.update(_key_metrics(key, spec, metas))
    statuses = Counter(slime_compat.status_name(s) for s in flat)
    for status in sorted({*_STATUSES, *statuses}):
        metrics[f"status/{status}"] = statuses[status] / n
    metrics["removed_ratio"] = sum(1 for s in flat if getattr(s, "remove_sample", False)) / n
    lengths = [getattr(s, "response_length", 0) or 0 for s in flat]
    metrics["response_length/mean"] = fmean(lengths)
    trained = [sum(getattr(s, "loss_mask", None) or []) for s in flat]
    metrics["model_tokens/mean"] = fmean(trained)
    # a process total, not per sample: the abort watcher polls flags, not episodes
    metrics["abort_detection/failed_checks"] = float(abort_check_failures())
    return metrics


def _step(args: Any, rollout_id: int) -> int:
    try:
        from slime.observability.metric_utils import compute_rollout_step
    except ImportError:
        return rollout_id
    return compute_rollout_step(args, rollout_id)


def _log(args: Any, metrics: dict[str, Any], step_key: str) -> None:
    try:
        from slime.observability import logging_utils
    except ImportError:
        logger.info("strands_slime metrics: %s", metrics)
        return
    logging_utils.log(args, metrics, step_key=step_key)


def log_rollout(
    rollout_id: int, args: Any, samples: Any, rollout_extra_metrics: Any = None, rollout_time: float = 0.0
) -> bool:
    """slime custom rollout log function: adds ``rollout/strands/*``; returns False (slime logs too)."""
    try:
        metrics = {f"rollout/strands/{k}": v for k, v in compute_rollout_metrics(samples).items()}
        if metrics:
            metrics["rollout/step"] = _step(args, rollout_id)
            _log(args, metrics, "rollout/step")
    except Exception:  # logging must never break training
        logger.exception("strands_slime rollout metrics failed")
    return False


def log_eval_rollout(rollout_id: int, args: Any, data: Mapping[str, Any], extra_metrics: Any = None) -> bool:
    """slime custom eval log function: adds ``eval/strands/<dataset>/*``; returns False."""
    try:
        metrics: dict[str, Any] = {}
        for name, result in data.items():
            samples = result.get("samples") if isinstance(result, Mapping) else None
            if samples:
                for key, value in compute_rollout_metrics(samples).items():
                    metrics[f"eval/strands/{name}/{key}"] = value
        if metrics:
            metrics["eval/step"] = _step(args, rollout_id)
            _log(args, metrics, "eval/step")
    except Exception:
        logger.exception("strands_slime eval metrics failed")
    return False
