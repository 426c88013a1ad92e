"""Rollout metrics for slime's logging: aggregates of the per-sample metadata ``generate`` writes.

``log_rollout`` and ``log_eval_rollout`` (slime's custom log function paths) add ``rollout/strands/*``
and ``eval/strands/<name>/*`` and return False, so slime's own logging still runs. slime hands them
only the groups it kept, so :func:`count_episode` (``--rollout-sample-hook-path``) counts every episode
generate returns; ``log_rollout`` adds those as ``rollout/strands/step/*`` and logs the step's record as
one ``strands_slime step <id>: <json>`` line, which reaches the Ray job's log from any node (the pilot
reads it back). Every metric: docs/rollout.md, "Metrics".
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from strands_slime.aborts import abort_check_failures
from strands_slime.episode_metadata import ANY, MAX, MEAN, TOTAL, MetricSpec, metric_specs
from strands_slime.rollout import slime_compat
from strands_slime.runtime import get_runtime

logger = logging.getLogger(__name__)

# always logged, as 0.0 when absent: a metric that disappears is a gap in W&B's charts, not a zero
_STATUSES = ("completed", "truncated", "aborted", "failed")


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
    flat = slime_compat.flatten(samples)
    if not flat:
        return {}
    metas: list[Mapping[str, Any]] = [getattr(s, "metadata", None) or {} for s in flat]
    # another agent's sample carries its episode's record: the episode counts once, through its main
    metas = [meta for meta in metas if meta.get("agent") in (None, "main")] or metas
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
    metrics["response_length/max"] = float(max(lengths))
    trained = [sum(getattr(s, "loss_mask", None) or []) for s in flat]
    metrics["model_tokens/mean"] = fmean(trained)
    # a process total, not per sample: the abort watcher polls flags, not episodes
    metrics["abort_detection/failed_checks"] = float(abort_check_failures())
    return metrics


# ----------------------------------------------------------------------------------------------
# Every episode of a step, whatever became of its group
# ----------------------------------------------------------------------------------------------

STEP_RECORD_PREFIX = "strands_slime step"
"""Start of the one log line per training step that holds its record (``<prefix> <id>: <json>``)."""

LENGTH_TRUNCATIONS = frozenset({"length", "response_budget", "context_length"})
"""``metadata.truncation`` values of episodes cut off by a token budget (not by a tool or call limit)."""

_TALLY_KEY = ("strands_slime.rollout.metrics", "step tallies")


@dataclass
class StepTally:
    """What :func:`count_episode` saw during one rollout step."""

    statuses: Counter[str] = field(default_factory=Counter)
    length_truncated: int = 0
    ended_tokens: int = 0
    """Response tokens of the episodes that ended (kept or dropped groups alike)."""
    aborted_tokens: int = 0
    """Response tokens the aborted episodes held (resumed or thrown away, per ``--partial-rollout``)."""
    resumed: int = 0
    """Episodes that went on from an earlier step's aborted attempt."""

    def as_metrics(self) -> dict[str, float]:
        """Counts by status, ratios and token totals (keys without a prefix)."""
        episodes = sum(self.statuses.values())
        metrics = {"episodes": float(episodes)}
        for status in sorted({*_STATUSES, *self.statuses}):
            metrics[status] = float(self.statuses[status])
        metrics["length_truncated"] = float(self.length_truncated)
        metrics["aborted_ratio"] = self.statuses["aborted"] / episodes if episodes else 0.0
        ended = episodes - self.statuses["aborted"]
        metrics["truncated_ratio"] = self.statuses["truncated"] / ended if ended else 0.0
        metrics["ended_tokens"] = float(self.ended_tokens)
        metrics["aborted_tokens"] = float(self.aborted_tokens)
        metrics["resumed"] = float(self.resumed)
        return metrics


def _tallies() -> dict[Any, StepTally]:
    runtime = get_runtime()
    return runtime.cached(runtime.loaded, _TALLY_KEY, dict)


def count_episode(args: Any, sample: Any, *, rollout_id: int | None = None, evaluation: bool = False) -> None:
    """slime's ``--rollout-sample-hook-path``: count one training episode generate returned.

    slime runs sample hooks on every sample generate returns, before the reward and before its
    dynamic-sampling filter or over-sampling abort decide the group's fate, so the step's counts
    include what is thrown away. Evaluation samples are not counted. Never raises.
    """
    del args
    if evaluation:
        return
    try:
        metadata = getattr(sample, "metadata", None) or {}
        status = slime_compat.status_name(sample)
        length = getattr(sample, "response_length", 0)
        length = length if isinstance(length, int) and not isinstance(length, bool) else 0
        with get_runtime().lock:
            tally = _tallies().setdefault(rollout_id, StepTally())
            tally.statuses[status] += 1
            if status == "aborted":
                tally.aborted_tokens += length
            else:
                tally.ended_tokens += length
            if status == "truncated" and metadata.get("truncation") in LENGTH_TRUNCATIONS:
                tally.length_truncated += 1
            resumes = metadata.get("resumes")
            if status != "aborted" and isinstance(resumes, int) and resumes > 0:
                tally.resumed += 1
    except Exception:  # counting must never break a rollout
        logger.exception("strands_slime: counting an episode failed")


def take_step_tally(rollout_id: int | None) -> StepTally | None:
    """The counts of ``rollout_id`` (None when the hook is not installed), forgetting it and any older step."""
    with get_runtime().lock:
        tallies = _tallies()
        tally = tallies.pop(rollout_id, None)
        for stale in [key for key in tallies if isinstance(key, int) and (rollout_id or 0) > key]:
            del tallies[stale]
    return tally


def step_metrics(
    samples: list[Any],
    extra_metrics: Mapping[str, Any] | None,
    rollout_time: float,
    tally: StepTally | None,
    group_size: int = 1,
) -> dict[str, float]:
    """The step's cost beyond the kept groups (keys without a prefix, under ``step/``).

    ``groups_dropped`` sums slime's ``rollout/dynamic_filter/drop_*`` counts; the kept groups are the
    distinct ``group_index`` values of ``samples`` (``len(samples) / group_size`` where one is missing).
    """
    metrics: dict[str, float] = {}
    groups = {getattr(s, "group_index", None) for s in samples}
    kept = float(len(groups) if None not in groups else len(samples) / max(group_size, 1))
    dropped = 0.0
    for key, value in (extra_metrics or {}).items():
        number = _number(value)
        if key.startswith("rollout/dynamic_filter/drop_") and number is not None:
            dropped += number
    metrics["groups_kept"] = kept
    metrics["groups_dropped"] = dropped
    metrics["keep_rate"] = kept / (kept + dropped) if kept + dropped else 0.0
    metrics["rollout_seconds"] = float(rollout_time)
    if tally is not None:
        metrics.update(tally.as_metrics())
        if rollout_time > 0:
            metrics["ended_tokens_per_s"] = tally.ended_tokens / rollout_time
    return {f"step/{key}": value for key, value in metrics.items()}


def _log_step_record(rollout_id: int, metrics: Mapping[str, Any]) -> None:
    """One line the pilot reads back from the job's log (JSON: finite numbers only)."""
    record = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    logger.info("%s %d: %s", STEP_RECORD_PREFIX, rollout_id, json.dumps(record, sort_keys=True))


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
        flat = slime_compat.flatten(samples or [])
        tally = take_step_tally(rollout_id)
        local = compute_rollout_metrics(flat)
        if flat or tally is not None:
            group_size = getattr(args, "n_samples_per_prompt", None)
            group_size = group_size if isinstance(group_size, int) and group_size > 0 else 1
            local.update(step_metrics(flat, rollout_extra_metrics, rollout_time, tally, group_size))
        metrics = {f"rollout/strands/{k}": v for k, v in local.items()}
        if metrics:
            _log_step_record(rollout_id, metrics)
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
