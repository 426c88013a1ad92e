"""The launch pilot: measure a few training steps, then project the full run from those numbers.

    python3 -m strands_slime.launch.pilot analyze --log JOB_LOG --out PILOT_DIR [--tensorboard DIR]
        [--gpu-samples FILE ...] --num-rollout N --gpus G [--checkpoint-dir DIR] ...

writes ``PILOT_DIR/pilot.json`` and ``pilot.md``. Every number comes from what the run itself wrote
(the job log, slime's TensorBoard files, the GPU samples, the checkpoint's size), never from an
assumption; what could not be measured is listed under ``missing`` with the reason. ``save-interval``
reads a ``pilot.json`` back. Sources of each number: docs/training.md, §2.6.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from strands_slime.rollout.metrics import STEP_RECORD_PREFIX

__all__ = [
    "JobLog",
    "Plan",
    "Thresholds",
    "analyze",
    "go_no_go",
    "main",
    "parse_job_log",
    "parse_step_records",
    "read_gpu_samples",
    "read_tensorboard_scalars",
    "save_interval_for",
]

PILOT_FORMAT = 1
"""Version of pilot.json's layout (``save-interval`` refuses others)."""
WARM_UP_STEPS = 1
"""Steps left out of the per-step statistics: the first pays for CUDA graphs, caches and allocator growth."""
LOGPROB_GAP_TAG = "train/train_rollout_logprob_abs_diff"

_STEP = re.compile(re.escape(STEP_RECORD_PREFIX) + r" (\d+): (\{.*\})\s*$")
_PERF = re.compile(r"\bperf (\d+): (\{.*\})\s*$")
_MEMORY = re.compile(r"\[Rank (\d+)\] Memory-Usage ([^:{]*?)(?: \(cleared before print\))?: (\{.*\})\s*$")
_TOKEN_USAGE = re.compile(r"\btoken usage: ([0-9.]+)")
_QUEUE = re.compile(r"#queue-req: (\d+)")
_TIMESTAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
_NUMPY_SCALAR = re.compile(r"\b(?:np|numpy)\.[a-z0-9_]+\(([^()]*)\)")
_TENSOR = re.compile(r"\btensor\(([^(),]*)(?:,[^()]*)?\)")


# ----------------------------------------------------------------------------------------------
# Reading what the run wrote
# ----------------------------------------------------------------------------------------------


def _literal_dict(text: str) -> dict[str, Any] | None:
    """A ``repr``-ed dict as slime logs it; numpy scalars and tensors read as their values."""
    for candidate in (text, _TENSOR.sub(r"\1", _NUMPY_SCALAR.sub(r"\1", text))):
        try:
            value = ast.literal_eval(candidate)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        return value if isinstance(value, dict) else None
    return None


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass
class JobLog:
    """What the pilot reads from the job's log."""

    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per step: slime's perf lines (rollout manager and trainer) merged with our step record."""
    records: set[int] = field(default_factory=set)
    """Steps with a ``strands_slime step`` record (the rollout log function ran)."""
    kv_token_usage: list[float] = field(default_factory=list)
    queued_requests: list[int] = field(default_factory=list)
    memory_used_gb: dict[int, float] = field(default_factory=dict)
    """Per trainer rank: the most ``Memory-Usage`` ever reported as used on its GPU."""
    first_time: datetime | None = None
    step_times: dict[int, datetime] = field(default_factory=dict)
    """When each step's record was logged."""
    unparsed: int = 0
    """perf/record/memory lines whose dict could not be read."""
    size_bytes: int = 0


def parse_step_records(text: str) -> dict[int, dict[str, float]]:
    """The ``strands_slime step <id>: {...}`` records in a log, by step."""
    return {step: values for step, values in _records(text.splitlines())}


def _records(lines: Iterable[str]) -> Iterable[tuple[int, dict[str, float]]]:
    for line in lines:
        match = _STEP.search(line)
        if match:
            try:
                record = json.loads(match.group(2))
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                yield int(match.group(1)), {k: v for k, v in record.items() if _finite(v) is not None}


def parse_job_log(text: str) -> JobLog:
    """Everything the pilot measures from the job's log (lines it does not know are skipped)."""
    log = JobLog(size_bytes=len(text.encode("utf-8", errors="replace")))
    for line in text.splitlines():
        stamp = _TIMESTAMP.search(line)
        when = None
        if stamp:
            try:
                when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")
            except ValueError:
                when = None
            if when is not None and log.first_time is None:
                log.first_time = when
        match = _STEP.search(line)
        if match:
            parsed = list(_records([line]))
            if not parsed:
                log.unparsed += 1
                continue
            step, record = parsed[0]
            log.steps.setdefault(step, {}).update(record)
            log.records.add(step)
            if when is not None:
                log.step_times[step] = when
            continue
        match = _PERF.search(line)
        if match:
            values = _literal_dict(match.group(2))
            if values is None:
                log.unparsed += 1
                continue
            numbers = {
                k: f for k, v in values.items() if isinstance(k, str) and (f := _finite(v)) is not None
            }
            log.steps.setdefault(int(match.group(1)), {}).update(numbers)
            continue
        match = _MEMORY.search(line)
        if match:
            values = _literal_dict(match.group(3))
            used = _finite(values.get("used_GB")) if values else None
            if used is None:
                log.unparsed += 1
                continue
            rank = int(match.group(1))
            log.memory_used_gb[rank] = max(used, log.memory_used_gb.get(rank, 0.0))
            continue
        usage = _TOKEN_USAGE.search(line)
        if usage:
            try:
                log.kv_token_usage.append(float(usage.group(1)))
            except ValueError:
                pass
            queue = _QUEUE.search(line)
            if queue:
                log.queued_requests.append(int(queue.group(1)))
    return log


def read_tensorboard_scalars(directory: Path, tags: Sequence[str]) -> dict[str, list[tuple[int, float]]]:
    """``(step, value)`` of each tag over every event file under ``directory`` (slime's processes
    each write their own).

    Raises:
        ImportError: the ``tensorboard`` package is not installed (slime's image has it).
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, list[tuple[int, float]]] = {tag: [] for tag in tags}
    files = sorted(directory.rglob("events.out.tfevents.*")) if directory.is_dir() else []
    for path in files:
        accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0})
        accumulator.Reload()
        available = set(accumulator.Tags().get("scalars", []))
        for tag in tags:
            if tag in available:
                found[tag].extend((event.step, float(event.value)) for event in accumulator.Scalars(tag))
    for values in found.values():
        values.sort()
    return found


def read_gpu_samples(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The nvidia-smi samples of ``gpu_sampler`` files (unreadable lines and failed readings skipped)."""
    samples: list[dict[str, Any]] = []
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("gpus"), list):
                samples.append(record)
    return samples


def directory_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (0 when it does not exist)."""
    if not path.is_dir():
        return 0
    return sum(
        entry.stat().st_size for entry in path.rglob("*") if entry.is_file() and not entry.is_symlink()
    )


# ----------------------------------------------------------------------------------------------
# Summaries
# ----------------------------------------------------------------------------------------------


def _stats(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
    return {
        "mean": statistics.fmean(ordered),
        "p50": statistics.median(ordered),
        "p90": p90,
        "max": ordered[-1],
        "n": float(len(ordered)),
    }


def _column(steps: Mapping[int, Mapping[str, float]], key: str) -> list[float]:
    return [values[key] for _, values in sorted(steps.items()) if key in values]


_STEP_KEYS = {
    "step_seconds": "pilot/step_time_without_save",
    "rollout_seconds": "perf/rollout_time",
    "train_seconds": "perf/train_time",
    "weight_sync_seconds": "perf/update_weights_time",
    "save_seconds": "perf/save_model_time",
    "tokens_per_gpu_per_s": "perf/tokens_per_gpu_per_sec",
    "ended_tokens_per_s": "rollout/strands/step/ended_tokens_per_s",
    "keep_rate": "rollout/strands/step/keep_rate",
    "truncated_ratio": "rollout/strands/step/truncated_ratio",
    "aborted_ratio": "rollout/strands/step/aborted_ratio",
    "length_truncated": "rollout/strands/step/length_truncated",
    "aborted": "rollout/strands/step/aborted",
    "resumed": "rollout/strands/step/resumed",
    "episodes": "rollout/strands/step/episodes",
    "groups_dropped": "rollout/strands/step/groups_dropped",
    "response_length_mean": "rollout/strands/response_length/mean",
    "response_length_max": "rollout/strands/response_length/max",
    "truncated_ratio_kept": "rollout/truncated_ratio",
}


def _gpu_memory(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    peak_used: dict[str, float] = {}
    total: dict[str, float] = {}
    roles: dict[str, float] = {}
    unknown_apps = 0
    for record in samples:
        node = record.get("node", 0)
        for gpu in record.get("gpus", []):
            key = f"node{node}/gpu{gpu.get('index')}"
            used, size = _finite(gpu.get("used_mib")), _finite(gpu.get("total_mib"))
            if used is not None:
                peak_used[key] = max(used, peak_used.get(key, 0.0))
            if size is not None:
                total[key] = size
        by_role_gpu: dict[tuple[str, Any], float] = {}
        for app in record.get("apps", []):
            used = _finite(app.get("used_mib"))
            if used is None:
                continue
            role = str(app.get("role", "unknown"))
            unknown_apps += role == "unknown"
            slot = (role, app.get("gpu"))
            by_role_gpu[slot] = by_role_gpu.get(slot, 0.0) + used
        for (role, _), used in by_role_gpu.items():
            roles[role] = max(used, roles.get(role, 0.0))
    if not peak_used:
        return {}
    headroom = {key: total[key] - peak_used[key] for key in peak_used if key in total}
    return {
        "peak_used_gib": max(peak_used.values()) / 1024,
        "gpu_total_gib": (max(total.values()) / 1024) if total else None,
        "min_headroom_gib": (min(headroom.values()) / 1024) if headroom else None,
        "peak_by_role_gib": {role: used / 1024 for role, used in sorted(roles.items())},
        "per_gpu_peak_gib": {key: used / 1024 for key, used in sorted(peak_used.items())},
        "unattributed_process_samples": unknown_apps,
        "samples": len(samples),
    }


# ----------------------------------------------------------------------------------------------
# analyze
# ----------------------------------------------------------------------------------------------


@dataclass
class Plan:
    """The full run the pilot projects (the launch script passes its settings)."""

    num_rollout: int
    gpus: int
    nodes: int = 1
    save_interval: int | None = None
    retain: str = "latest"
    checkpoint_gb: float | None = None
    """Fallback checkpoint size when the pilot saved none."""
    max_hours_at_risk: float = 2.0
    gpu_hour_price: float | None = None
    settings: dict[str, str] = field(default_factory=dict)
    eval_interval: int = 0
    """The full run's --eval-interval (0: no evaluation); the pilot itself runs none."""
    eval_prompts: int = 0
    eval_samples_per_prompt: int = 1
    eval_max_response_len: int | None = None
    max_tokens_per_gpu: int | None = None
    run_hours: float | None = None
    """Wall-clock hours the user has: the projection sizes NUM_ROLLOUT to fit them."""
    thresholds: Thresholds = field(default_factory=lambda: Thresholds())


@dataclass
class Thresholds:
    """The go/no-go limits the pilot reports PASS/FAIL against (pilot.md, pilot.json ``checks``)."""

    min_gpu_headroom_gib: float = 4.0
    max_logprob_gap: float = 0.05
    max_truncated_ratio: float = 0.2
    max_aborted_ratio: float = 0.5
    min_keep_rate: float = 0.25
    max_kv_cache_usage: float = 0.98
    max_days: float | None = None


def analyze(
    log: JobLog,
    plan: Plan,
    *,
    logprob_gap: Sequence[tuple[int, float]] | None = None,
    logprob_gap_missing: str | None = None,
    gpu_samples: Sequence[Mapping[str, Any]] = (),
    checkpoint_bytes: int | None = None,
) -> dict[str, Any]:
    """pilot.json's content: per-step numbers, what was measured, the projection and what is missing."""
    missing: dict[str, str] = {}
    steps = {step: dict(values) for step, values in sorted(log.steps.items())}
    for values in steps.values():
        # slime's perf/step_time is the trainer's wait plus its training: the wait after a save holds
        # the save, which the projection counts on its own (once per save, not in every step's mean).
        if "perf/step_time" in values:
            values["pilot/step_time_without_save"] = values["perf/step_time"] - values.get(
                "perf/save_model_time", 0.0
            )
    measured_steps = {s: v for s, v in steps.items() if s >= WARM_UP_STEPS} or steps
    if not steps:
        missing["steps"] = "no `perf` or `strands_slime step` line in the job log: did the job reach step 0?"
    if steps and not log.records:
        missing["episode_counts"] = (
            "no `strands_slime step` record: --custom-rollout-log-function-path must be "
            "strands_slime.rollout.metrics.log_rollout"
        )
    elif steps and "rollout/strands/step/episodes" not in next(iter(steps.values())):
        missing["episode_counts"] = (
            "step records carry no episode counts: --rollout-sample-hook-path must include "
            "strands_slime.rollout.metrics.count_episode"
        )

    per_step = {name: _stats(_column(measured_steps, key)) for name, key in _STEP_KEYS.items()}
    split = {
        name: per_step[name]["mean"] if per_step[name] else None
        for name in ("rollout_seconds", "train_seconds", "weight_sync_seconds")
    }
    step_mean = per_step["step_seconds"]["mean"] if per_step["step_seconds"] else None
    if step_mean is None:
        missing["step_seconds"] = "no perf/step_time from the trainer (a step must finish training)"
    else:
        split["other_seconds"] = step_mean - sum(v for v in split.values() if v is not None)

    gap = [value for step, value in (logprob_gap or []) if step >= 0]
    if not gap:
        missing["logprob_gap"] = logprob_gap_missing or (
            f"no {LOGPROB_GAP_TAG} in the TensorBoard files (it needs --use-tis or "
            "--use-rollout-logprobs, and --use-tensorboard)"
        )
    memory = _gpu_memory(gpu_samples)
    if not memory:
        missing["gpu_memory"] = "no nvidia-smi sample (the pilot's gpu_sampler wrote nothing readable)"
    elif memory["unattributed_process_samples"]:
        missing["gpu_memory_by_role"] = (
            "some GPU processes could not be named (nvidia-smi reports PIDs this namespace does not "
            "see): per-role peaks cover the named ones only"
        )
    if not log.kv_token_usage:
        missing["kv_cache_usage"] = "no SGLang scheduler line with `token usage` in the job log"

    checkpoint_gb = checkpoint_bytes / 1e9 if checkpoint_bytes else None
    if checkpoint_gb is None:
        missing["checkpoint_size"] = "the pilot saved no checkpoint: disk uses the given --checkpoint-gb"
    startup = None
    if log.first_time is not None and 0 in log.step_times:
        startup = (log.step_times[0] - log.first_time).total_seconds() - steps.get(0, {}).get(
            "perf/rollout_time", 0.0
        )

    measured = {
        "steps_seen": sorted(steps),
        "warm_up_steps_excluded": [s for s in steps if s not in measured_steps],
        "per_step": per_step,
        "step_split_mean_seconds": split,
        "logprob_gap": _stats(gap),
        "gpu_memory": memory or None,
        "trainer_memory_used_gb_max": max(log.memory_used_gb.values()) if log.memory_used_gb else None,
        "kv_cache_token_usage": _stats(log.kv_token_usage),
        "queued_requests_max": max(log.queued_requests) if log.queued_requests else None,
        "checkpoint_gb": checkpoint_gb,
        "startup_seconds": startup,
        "log_bytes_per_step": (log.size_bytes / len(steps)) if steps else None,
        "unparsed_lines": log.unparsed,
        # every step counts here, the first too: the longest episode trained, in tokens
        "longest_response_tokens": max(_column(steps, "rollout/strands/response_length/max"), default=None),
        "max_tokens_per_gpu": plan.max_tokens_per_gpu,
    }
    if measured["longest_response_tokens"] is None and steps:
        missing["longest_response"] = "no rollout/strands/response_length/max in the step records"
    projection = project(measured, plan)
    return {
        "format": PILOT_FORMAT,
        "settings": dict(plan.settings),
        "measured": measured,
        "projection": projection,
        "checks": go_no_go(measured, projection, plan.thresholds),
        "missing": missing,
    }


def go_no_go(
    measured: Mapping[str, Any], projection: Mapping[str, Any], limits: Thresholds
) -> list[dict[str, Any]]:
    """PASS / FAIL / UNKNOWN (not measured) for each threshold a run should meet before it starts."""
    per_step = measured["per_step"]
    memory = measured.get("gpu_memory") or {}
    gap = measured.get("logprob_gap") or {}

    def mean(name: str) -> float | None:
        stats = per_step.get(name)
        return stats["mean"] if stats else None

    rows = [
        (
            "least GPU memory headroom (GiB)",
            memory.get("min_headroom_gib"),
            ">=",
            limits.min_gpu_headroom_gib,
        ),
        ("logprob gap |Megatron - SGLang|, mean", gap.get("mean"), "<=", limits.max_logprob_gap),
        ("truncated episodes, mean ratio", mean("truncated_ratio"), "<=", limits.max_truncated_ratio),
        (
            "episodes aborted by over-sampling, mean ratio",
            mean("aborted_ratio"),
            "<=",
            limits.max_aborted_ratio,
        ),
        ("dynamic-sampling keep rate, mean", mean("keep_rate"), ">=", limits.min_keep_rate),
        (
            "SGLang KV cache token usage, peak",
            (measured.get("kv_cache_token_usage") or {}).get("max"),
            "<=",
            limits.max_kv_cache_usage,
        ),
    ]
    longest, cap = measured.get("longest_response_tokens"), measured.get("max_tokens_per_gpu")
    if cap:
        rows.append(("longest trained episode (tokens) within MAX_TOKENS_PER_GPU", longest, "<=", float(cap)))
    if limits.max_days is not None:
        rows.append(("projected wall-clock days", projection.get("wall_clock_days"), "<=", limits.max_days))
    checks = []
    for name, value, op, limit in rows:
        if value is None:
            verdict = "UNKNOWN"
        else:
            verdict = "PASS" if (value >= limit if op == ">=" else value <= limit) else "FAIL"
        checks.append({"check": name, "value": value, "limit": f"{op} {limit:g}", "verdict": verdict})
    return checks


def save_interval_for(step_seconds: float, hours: float, num_rollout: int | None = None) -> int:
    """The most steps whose time (at ``step_seconds`` each) stays within ``hours``; at least 1."""
    steps = max(1, math.floor(hours * 3600 / step_seconds)) if step_seconds > 0 else 1
    return min(steps, num_rollout) if num_rollout else steps


def project(measured: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """Time, GPU-hours and disk of ``plan`` from the measured numbers (None where they are missing)."""
    per_step = measured["per_step"]
    step = per_step.get("step_seconds")
    if not step:
        return {"complete": False, "why": "no measured step time"}
    interval_from_pilot = save_interval_for(step["p90"], plan.max_hours_at_risk, plan.num_rollout)
    interval = plan.save_interval or interval_from_pilot
    saves = math.ceil(plan.num_rollout / interval)
    save_seconds = per_step.get("save_seconds")
    save_time = save_seconds["mean"] if save_seconds else 0.0
    startup = measured.get("startup_seconds") or 0.0
    evals, eval_each, eval_why = _evaluation(per_step, plan)
    eval_total = evals * eval_each if eval_each is not None else 0.0
    seconds = plan.num_rollout * step["mean"] + saves * save_time + eval_total + startup
    hours = seconds / 3600
    fit = None
    if plan.run_hours is not None:
        per_rollout = step["mean"] + save_time / interval
        if plan.eval_interval > 0 and eval_each is not None:
            per_rollout += eval_each / plan.eval_interval
        fit = max(0, math.floor((plan.run_hours * 3600 - startup) / per_rollout))
    checkpoint_gb = measured.get("checkpoint_gb") or plan.checkpoint_gb
    disk = None
    if checkpoint_gb is not None:
        kept = 2 if plan.retain == "latest" else saves  # the new one is written before the old goes
        logs_gb = (measured.get("log_bytes_per_step") or 0.0) * plan.num_rollout / 1e9
        disk = {
            "checkpoints_gb": kept * checkpoint_gb,
            "logs_gb": logs_gb,
            "total_gb": kept * checkpoint_gb + logs_gb,
            "checkpoints_kept": kept,
        }
    gpu_hours = hours * plan.gpus
    return {
        "complete": True,
        "num_rollout": plan.num_rollout,
        "gpus": plan.gpus,
        "nodes": plan.nodes,
        "step_seconds_mean": step["mean"],
        "step_seconds_p90": step["p90"],
        "wall_clock_hours": hours,
        "wall_clock_days": hours / 24,
        "wall_clock_hours_if_every_step_were_p90": (plan.num_rollout * step["p90"] + saves * save_time)
        / 3600,
        "gpu_hours": gpu_hours,
        "cost": gpu_hours * plan.gpu_hour_price if plan.gpu_hour_price is not None else None,
        "gpu_hour_price": plan.gpu_hour_price,
        "save_interval": interval,
        "save_interval_for_max_hours_at_risk": interval_from_pilot,
        "max_hours_at_risk": plan.max_hours_at_risk,
        "hours_at_risk_at_save_interval": interval * step["p90"] / 3600,
        "saves": saves,
        "save_seconds_each": save_time if save_seconds else None,
        "startup_seconds_each_launch": startup or None,
        "evaluations": evals,
        "eval_seconds_each": eval_each,
        "eval_hours": eval_total / 3600 if eval_each is not None else None,
        "eval_fraction": eval_total / seconds if eval_each is not None and seconds > 0 else None,
        "eval_estimate": eval_why,
        "run_hours": plan.run_hours,
        "num_rollout_for_run_hours": fit,
        "disk": disk,
        "excluded": "restarts after crashes"
        + ("" if eval_each is not None or not evals else "; evaluation (see eval_estimate)"),
    }


def _evaluation(per_step: Mapping[str, Any], plan: Plan) -> tuple[int, float | None, str]:
    """(evaluations in the run, seconds each, how that was estimated). The pilot runs no evaluation:
    each is estimated from the pilot's own generation throughput (tokens of ended episodes per second)
    and mean response length, capped at the eval budget."""
    if plan.eval_interval <= 0 or plan.eval_prompts <= 0:
        return 0, None, "no evaluation in the run"
    evals = plan.num_rollout // plan.eval_interval + 1  # slime evaluates before the first step too
    rate = per_step.get("ended_tokens_per_s")
    length = per_step.get("response_length_mean")
    if not rate or not length or rate["mean"] <= 0:
        return evals, None, "not estimated: the pilot measured no tokens/s or response length"
    tokens = min(length["mean"], plan.eval_max_response_len or length["mean"])
    episodes = plan.eval_prompts * plan.eval_samples_per_prompt
    each = episodes * tokens / rate["mean"]
    why = (
        f"{episodes} episodes of ~{tokens:,.0f} tokens at the pilot's {rate['mean']:,.0f} tokens/s "
        "(an estimate: evaluation answers may run longer or shorter than training's)"
    )
    return evals, each, why


def _fmt(value: Any, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "not measured"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value}{unit}"


def report(pilot: Mapping[str, Any]) -> str:
    """The short human-readable report (pilot.md)."""
    measured, projection, missing = pilot["measured"], pilot["projection"], pilot["missing"]
    per_step = measured["per_step"]
    split = measured["step_split_mean_seconds"]

    def mean(name: str, digits: int = 1, scale: float = 1.0, unit: str = "") -> str:
        stats = per_step.get(name)
        return _fmt(stats["mean"] * scale if stats else None, digits, unit)

    memory = measured.get("gpu_memory") or {}
    gap = measured.get("logprob_gap")
    lines = [
        "# Pilot report",
        "",
        f"Steps measured: {len(measured['steps_seen'])} (first {WARM_UP_STEPS} left out of the statistics).",
        "",
        "## Per step (mean over the measured steps)",
        f"- step time: {mean('step_seconds', unit=' s')} (p90 "
        f"{_fmt(per_step['step_seconds']['p90'] if per_step.get('step_seconds') else None, unit=' s')})",
        f"- rollout {_fmt(split.get('rollout_seconds'), unit=' s')}, train {_fmt(split.get('train_seconds'), unit=' s')}, "
        f"weight sync {_fmt(split.get('weight_sync_seconds'), unit=' s')}, other {_fmt(split.get('other_seconds'), unit=' s')}",
        f"- tokens/s (episodes that ended, all groups): {mean('ended_tokens_per_s', 0)}; slime's tokens/GPU/s "
        f"(kept groups): {mean('tokens_per_gpu_per_s', 0)}",
        f"- keep rate of dynamic sampling: {mean('keep_rate', 0, 100, ' %')}",
        f"- truncated (all ended episodes): {mean('truncated_ratio', 1, 100, ' %')}; cut off by the token budget: "
        f"{mean('length_truncated', 1)} episodes/step",
        f"- aborted by over-sampling: {mean('aborted_ratio', 1, 100, ' %')} of episodes; resumed next step: "
        f"{mean('resumed', 1)}/step",
        f"- logprob gap |Megatron - SGLang|: {_fmt(gap['mean'] if gap else None, 4)} (max {_fmt(gap['max'] if gap else None, 4)})",
        "",
        "## Memory",
        f"- peak GPU memory used: {_fmt(memory.get('peak_used_gib'), unit=' GiB')} of "
        f"{_fmt(memory.get('gpu_total_gib'), unit=' GiB')}; by role: "
        + (
            ", ".join(f"{r} {v:.1f} GiB" for r, v in (memory.get("peak_by_role_gib") or {}).items())
            or "not measured"
        ),
        f"- longest trained episode: {_fmt(measured.get('longest_response_tokens'), 0, ' tokens')} "
        f"(MAX_TOKENS_PER_GPU {_fmt(measured.get('max_tokens_per_gpu'))}; a longer one is trained alone in its "
        "micro-batch, above the cap: with no context parallelism that decides the trainer's peak memory)",
        "- the trainer's Memory-Usage lines are samples (Ray folds repeated lines), not maxima: the "
        "nvidia-smi peaks above are the measure",
        f"- least headroom on any GPU: {_fmt(memory.get('min_headroom_gib'), unit=' GiB')}; SGLang KV cache token "
        f"usage peak {_fmt((measured.get('kv_cache_token_usage') or {}).get('max'), 2)}, most queued requests "
        f"{_fmt(measured.get('queued_requests_max'))}",
        "",
        "## Projection for the full run",
    ]
    if projection.get("complete"):
        disk = projection.get("disk") or {}
        lines += [
            f"- {projection['num_rollout']} steps on {projection['gpus']} GPUs: "
            f"{projection['wall_clock_hours']:,.1f} h ({projection['wall_clock_days']:,.2f} days), "
            f"{projection['gpu_hours']:,.0f} GPU-hours"
            + (
                f", {projection['cost']:,.0f} at {projection['gpu_hour_price']}/GPU-hour"
                if projection.get("cost")
                else ""
            ),
            f"- checkpoints every {projection['save_interval']} steps ({projection['hours_at_risk_at_save_interval']:,.2f} h "
            f"at risk at p90 step time), {projection['saves']} saves",
            f"- disk: {_fmt(disk.get('total_gb'), unit=' GB')} ({disk.get('checkpoints_kept', '?')} checkpoints "
            f"at once, logs {_fmt(disk.get('logs_gb'), 2, ' GB')})",
            f"- evaluation: {projection['evaluations']} runs, {_fmt(projection.get('eval_hours'), 1, ' h')}"
            + (
                f" ({projection['eval_fraction'] * 100:.0f} % of the wall clock)"
                if projection.get("eval_fraction") is not None
                else ""
            )
            + f"; {projection['eval_estimate']}",
            f"- not included: {projection['excluded']}",
        ]
        if projection.get("run_hours") is not None:
            lines.append(
                f"- NUM_ROLLOUT that fits {projection['run_hours']:g} h: {projection['num_rollout_for_run_hours']}"
            )
    else:
        lines.append(f"- not possible: {projection.get('why')}")
    checks = pilot.get("checks") or []
    if checks:
        verdicts = {check["verdict"] for check in checks}
        overall = (
            "NO-GO"
            if "FAIL" in verdicts
            else ("GO" if verdicts == {"PASS"} else "GO, with checks not measured")
        )
        lines += ["", f"## Go / no-go: {overall}"]
        lines += [
            f"- {check['verdict']}: {check['check']} = {_fmt(check['value'], 3)} (limit {check['limit']})"
            for check in checks
        ]
    settings = pilot.get("settings") or {}
    if settings:
        lines += ["", "## Settings of the measured run"] + [f"- {k}={v}" for k, v in sorted(settings.items())]
    if missing:
        lines += ["", "## Not measured"] + [f"- {name}: {why}" for name, why in missing.items()]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------


def _settings(pairs: Sequence[str]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"--setting wants NAME=VALUE, got {pair!r}")
        settings[name] = value
    return settings


def _analyze_command(options: argparse.Namespace) -> int:
    try:
        text = options.log.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        print(f"error: cannot read the job log: {error}", file=sys.stderr)
        return 1
    log = parse_job_log(text)
    gap: list[tuple[int, float]] | None = None
    gap_missing = None
    if options.tensorboard is None:
        gap_missing = "no TensorBoard directory given"
    else:
        try:
            gap = read_tensorboard_scalars(options.tensorboard, [LOGPROB_GAP_TAG])[LOGPROB_GAP_TAG]
        except ImportError:
            gap_missing = "the tensorboard package is not installed here (pip install tensorboard)"
    checkpoint = directory_bytes(options.checkpoint_dir) if options.checkpoint_dir else None
    plan = Plan(
        num_rollout=options.num_rollout,
        gpus=options.gpus,
        nodes=options.nodes,
        save_interval=options.save_interval,
        retain=options.retain,
        checkpoint_gb=options.checkpoint_gb,
        max_hours_at_risk=options.max_hours_at_risk,
        gpu_hour_price=options.gpu_hour_price,
        settings=_settings(options.setting),
        eval_interval=options.eval_interval,
        eval_prompts=options.eval_prompts,
        eval_samples_per_prompt=options.eval_samples_per_prompt,
        eval_max_response_len=options.eval_max_response_len,
        max_tokens_per_gpu=options.max_tokens_per_gpu,
        run_hours=options.run_hours,
        thresholds=Thresholds(
            min_gpu_headroom_gib=options.min_gpu_headroom_gib,
            max_logprob_gap=options.max_logprob_gap,
            max_days=options.max_days,
        ),
    )
    pilot = analyze(
        log,
        plan,
        logprob_gap=gap,
        logprob_gap_missing=gap_missing,
        gpu_samples=read_gpu_samples(options.gpu_samples),
        checkpoint_bytes=checkpoint or None,
    )
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "pilot.json").write_text(json.dumps(pilot, indent=2, sort_keys=True) + "\n")
    text_report = report(pilot)
    (options.out / "pilot.md").write_text(text_report)
    print(text_report, end="")
    return 0 if pilot["projection"].get("complete") else 1


class PilotMismatch(ValueError):
    """A pilot.json that cannot size this run: unreadable, another format or no measured step time."""


class PilotSettingsDiffer(PilotMismatch):
    """The pilot ran under other settings that decide a step's time."""


def save_interval_from_pilot(
    path: Path, hours: float, num_rollout: int | None, settings: Mapping[str, str]
) -> tuple[int, float]:
    """(steps per checkpoint, the pilot's p90 step time) from ``path``, measured under ``settings``.

    Raises:
        PilotMismatch: in one line, why this pilot does not size this run.
    """
    try:
        pilot = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise PilotMismatch(f"cannot read {path}: {error}") from None
    if not isinstance(pilot, dict) or pilot.get("format") != PILOT_FORMAT:
        raise PilotMismatch(f"{path} is not a pilot.json of format {PILOT_FORMAT}")
    recorded = pilot.get("settings") or {}
    different = sorted(name for name in settings if recorded.get(name) != settings[name])
    if different:
        changes = ", ".join(f"{n}: pilot {recorded.get(n)!r}, now {settings[n]!r}" for n in different)
        raise PilotSettingsDiffer(f"the pilot ran other settings ({changes}); run the pilot again")
    step = ((pilot.get("measured") or {}).get("per_step") or {}).get("step_seconds")
    if not step:
        raise PilotMismatch(f"{path} has no measured step time")
    return save_interval_for(step["p90"], hours, num_rollout), float(step["p90"])


def _save_interval_command(options: argparse.Namespace) -> int:
    try:
        interval, step_p90 = save_interval_from_pilot(
            options.pilot, options.hours, options.num_rollout, _settings(options.setting)
        )
    except PilotMismatch as error:
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, PilotSettingsDiffer) else 1
    print(interval, f"{step_p90:.1f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``analyze`` a pilot's outputs, or print the ``save-interval`` a pilot.json gives."""
    parser = argparse.ArgumentParser(
        prog="python -m strands_slime.launch.pilot", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("analyze", help="measure a pilot's outputs and project the full run")
    run.add_argument("--log", type=Path, required=True, help="the Ray job's log (the launcher's log)")
    run.add_argument("--out", type=Path, required=True, help="where pilot.json and pilot.md go")
    run.add_argument("--tensorboard", type=Path, help="slime's TENSORBOARD_DIR of the pilot")
    run.add_argument("--gpu-samples", type=Path, nargs="*", default=[], help="gpu_sampler files")
    run.add_argument("--checkpoint-dir", type=Path, help="the checkpoint the pilot saved (measured with du)")
    run.add_argument("--num-rollout", type=int, required=True, help="steps of the full run")
    run.add_argument("--gpus", type=int, required=True, help="GPUs of the full run")
    run.add_argument("--nodes", type=int, default=1)
    run.add_argument("--save-interval", type=int, help="default: what keeps --max-hours-at-risk")
    run.add_argument("--retain", choices=("latest", "all"), default="latest")
    run.add_argument("--checkpoint-gb", type=float, help="checkpoint size if the pilot saved none")
    run.add_argument("--max-hours-at-risk", type=float, default=2.0)
    run.add_argument("--gpu-hour-price", type=float, help="price of one GPU-hour (no cost without it)")
    run.add_argument("--setting", action="append", default=[], help="NAME=VALUE recorded in pilot.json")
    run.add_argument("--eval-interval", type=int, default=0, help="the full run's --eval-interval (0: none)")
    run.add_argument("--eval-prompts", type=int, default=0, help="prompts in the full run's eval datasets")
    run.add_argument("--eval-samples-per-prompt", type=int, default=1)
    run.add_argument("--eval-max-response-len", type=int)
    run.add_argument("--max-tokens-per-gpu", type=int)
    run.add_argument("--run-hours", type=float, help="wall-clock hours available: sizes NUM_ROLLOUT")
    run.add_argument("--max-days", type=float, help="go/no-go: the projected run must fit in this many days")
    run.add_argument("--min-gpu-headroom-gib", type=float, default=Thresholds.min_gpu_headroom_gib)
    run.add_argument("--max-logprob-gap", type=float, default=Thresholds.max_logprob_gap)
    interval = commands.add_parser("save-interval", help="steps per checkpoint from a pilot.json")
    interval.add_argument("pilot", type=Path)
    interval.add_argument("--hours", type=float, required=True, help="most hours a crash may cost")
    interval.add_argument("--num-rollout", type=int)
    interval.add_argument("--setting", action="append", default=[], help="NAME=VALUE the pilot must have run")
    options = parser.parse_args(argv)
    try:
        if options.command == "analyze":
            return _analyze_command(options)
        return _save_interval_command(options)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    return 2  # pragma: no cover - parser.error exits


if __name__ == "__main__":
    sys.exit(main())
