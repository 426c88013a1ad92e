"""Evaluation metrics for AIME-style data: accuracy, avg@n and unbiased pass@k per prompt group.

Correctness is DAPO accuracy (``acc`` from the reward), not ``reward == 1``: shaping or custom
reward values must not change what counts as solved. ``summarize`` takes plain per-sample records,
so it works on ``strands-slime rollout`` output, slime ``Sample`` objects (via ``record_from_sample``)
or any JSONL dump.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strands_slime.episode_metadata import EpisodeMetadata

__all__ = [
    "EvalSummary",
    "avg_at_k",
    "pass_at_k",
    "powers_of_two_up_to",
    "record_from_sample",
    "summarize",
    "summarize_by",
]

GROUP_KEYS = ("group", "prompt_id", "group_index")
CORRECT_KEYS = ("correct", "acc")
DEFAULT_EXCLUDED_STATUSES = ("aborted",)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with ``n`` samples of which ``c`` are correct (Chen et al., 2021).

    ``1 - C(n - c, k) / C(n, k)``: the chance that at least one of ``k`` samples drawn without
    replacement from the ``n`` is correct. Exact integer arithmetic, so large ``n`` is fine.

    Raises:
        TypeError: ``n``, ``c`` or ``k`` is not an int (a bool is refused too).
        ValueError: the counts are impossible (``n < 1``, ``c`` outside ``0..n``, ``k`` outside ``1..n``).
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"pass_at_k: {name} must be an int, got {value!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def avg_at_k(groups: Iterable[Sequence[bool]]) -> float:
    """avg@k: per-prompt accuracy over its k samples, averaged over prompts (every prompt weighs the same).

    Raises:
        ValueError: there are no groups, or a group has no samples.
    """
    accuracies = []
    for index, outcomes in enumerate(groups):
        if len(outcomes) == 0:
            raise ValueError(f"avg_at_k: prompt group {index} has no samples")
        accuracies.append(sum(bool(outcome) for outcome in outcomes) / len(outcomes))
    if not accuracies:
        raise ValueError("avg_at_k: no prompt groups")
    return sum(accuracies) / len(accuracies)


def powers_of_two_up_to(n: int) -> list[int]:
    """1, 2, 4, ... up to ``n`` (the k values slime's ``--log-passrate`` reports)."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks


@dataclass(frozen=True)
class EvalSummary:
    """Metrics over one evaluation set; ``as_dict`` flattens them for logging/JSON."""

    num_samples: int
    num_scored: int
    num_prompts: int
    min_samples_per_prompt: int
    max_samples_per_prompt: int
    accuracy: float | None
    avg_at_n: float | None
    pass_at: dict[int, float] = field(default_factory=dict)
    mean_reward: float | None = None
    truncated_ratio: float | None = None
    status_counts: dict[str, int] = field(default_factory=dict)
    excluded: int = 0
    unscored: int = 0

    def as_dict(self) -> dict[str, Any]:
        """``{"accuracy": .., "avg@16": .., "pass@1": .., ..., "status/completed": ..}``."""
        flat: dict[str, Any] = {
            "num_samples": self.num_samples,
            "num_scored": self.num_scored,
            "num_prompts": self.num_prompts,
            "samples_per_prompt_min": self.min_samples_per_prompt,
            "samples_per_prompt_max": self.max_samples_per_prompt,
            "accuracy": self.accuracy,
            f"avg@{self.min_samples_per_prompt}": self.avg_at_n,
        }
        flat.update({f"pass@{k}": value for k, value in sorted(self.pass_at.items())})
        flat.update(
            {
                "mean_reward": self.mean_reward,
                "truncated_ratio": self.truncated_ratio,
                "excluded": self.excluded,
                "unscored": self.unscored,
            }
        )
        flat.update({f"status/{status}": count for status, count in sorted(self.status_counts.items())})
        return flat

    def render_markdown(self, title: str = "eval") -> str:
        """A small Markdown table for reports and the rollout CLI."""
        rows = [(key, value) for key, value in self.as_dict().items() if value is not None]
        lines = [f"| {title} | value |", "|---|---|"]
        for key, value in rows:
            shown = f"{value:.4f}" if isinstance(value, float) else str(value)
            lines.append(f"| {key} | {shown} |")
        return "\n".join(lines)


def _status_name(status: object) -> str:
    if status is None:
        return "unknown"
    value = getattr(status, "value", status)  # slime's Status enum values are the lowercase names
    return str(value).lower()


def _first_present(record: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if key in record and record[key] is not None:
            return record[key]
    return None


def summarize(
    records: Iterable[Mapping[str, Any]],
    *,
    ks: Sequence[int] | None = None,
    exclude_statuses: Sequence[str] = DEFAULT_EXCLUDED_STATUSES,
) -> EvalSummary:
    """Accuracy, avg@n and pass@k (k = powers of two up to the smallest group, or ``ks``).

    Each record needs a prompt group id (``group``, ``prompt_id`` or ``group_index``) and, to be
    scored, ``correct`` or ``acc``; ``reward`` and ``status`` are optional. Records whose status is in
    ``exclude_statuses`` (aborted samples were never scored) and records without correctness are
    counted (``excluded``/``unscored``, ``status_counts``) but left out of the metrics.

    Raises:
        TypeError: a record is not a mapping.
        ValueError: a scorable record has no group id, or a ``ks`` value is outside 1..smallest group.
    """
    excluded_statuses = {status.lower() for status in exclude_statuses}
    groups: dict[Any, list[bool]] = defaultdict(list)
    status_counts: Counter[str] = Counter()
    rewards: list[float] = []
    num_samples = excluded = unscored = truncated = 0
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise TypeError(f"summarize: record {index} is {type(record).__name__}, expected a mapping")
        num_samples += 1
        status = _status_name(record.get("status"))
        status_counts[status] += 1
        if status in excluded_statuses:
            excluded += 1
            continue
        group = _first_present(record, GROUP_KEYS)
        if group is None:
            raise ValueError(
                f"summarize: record {index} has no prompt group id (one of {', '.join(GROUP_KEYS)})"
            )
        correct = _first_present(record, CORRECT_KEYS)
        if correct is None:
            unscored += 1
            continue
        groups[group].append(bool(correct))
        truncated += status == "truncated"
        reward = record.get("reward")
        if isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward):
            rewards.append(float(reward))

    sizes = [len(outcomes) for outcomes in groups.values()]
    num_scored = sum(sizes)
    min_n, max_n = (min(sizes), max(sizes)) if sizes else (0, 0)
    if ks is None:
        chosen_ks = powers_of_two_up_to(min_n)
    else:
        chosen_ks = sorted(set(ks))
        bad = [k for k in chosen_ks if isinstance(k, bool) or not isinstance(k, int) or k < 1 or k > min_n]
        if bad:
            raise ValueError(
                f"summarize: k must be integers in 1..{min_n} (smallest prompt group); got {bad}"
            )
    pass_at = {
        k: sum(pass_at_k(len(outcomes), sum(outcomes), k) for outcomes in groups.values()) / len(groups)
        for k in chosen_ks
    }
    return EvalSummary(
        num_samples=num_samples,
        num_scored=num_scored,
        num_prompts=len(groups),
        min_samples_per_prompt=min_n,
        max_samples_per_prompt=max_n,
        accuracy=sum(sum(outcomes) for outcomes in groups.values()) / num_scored if num_scored else None,
        avg_at_n=avg_at_k(groups.values()) if groups else None,
        pass_at=pass_at,
        mean_reward=sum(rewards) / len(rewards) if rewards else None,
        truncated_ratio=truncated / num_scored if num_scored else None,
        status_counts=dict(status_counts),
        excluded=excluded,
        unscored=unscored,
    )


def summarize_by(
    records: Iterable[Mapping[str, Any]], key: str = "dataset", **options: Any
) -> dict[str, EvalSummary]:
    """``summarize`` per value of ``records[key]`` (e.g. one summary per eval dataset)."""
    buckets: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        buckets[str(record.get(key, ""))].append(record)
    return {name: summarize(bucket, **options) for name, bucket in sorted(buckets.items())}


def record_from_sample(sample: Any, *, reward_key: str | None = None) -> dict[str, Any]:
    """A ``summarize`` record from a slime ``Sample`` (or anything with its attributes).

    Correctness comes from our reward's verdict (``EpisodeMetadata.reward_details["acc"]``), else a
    dict reward's ``acc``; only for rewards from elsewhere does it fall back to ``reward == 1``. An
    unrewarded sample (``reward is None``) has ``correct = None`` and is counted as unscored.

    Args:
        sample: a slime ``Sample`` or an object with its attributes (missing ones read as None).
        reward_key: the key of a dict reward's scalar (slime's ``--reward-key``); default ``score``.

    Raises:
        TypeError: ``sample.metadata`` is neither None nor a mapping.
    """
    details = EpisodeMetadata.from_metadata(getattr(sample, "metadata", None)).reward_details
    reward = getattr(sample, "reward", None)
    correct: bool | None = None
    if isinstance(details, dict) and isinstance(details.get("acc"), bool):
        correct = details["acc"]
    elif isinstance(reward, dict) and "acc" in reward:
        correct = bool(reward["acc"])
    elif isinstance(reward, (int, float)):
        correct = reward == 1
    scalar = reward.get(reward_key or "score") if isinstance(reward, dict) else reward
    group = getattr(sample, "group_index", None)
    return {
        "group": group if group is not None else _prompt_key(getattr(sample, "prompt", None)),
        "index": getattr(sample, "index", None),
        "correct": correct,
        "reward": scalar if isinstance(scalar, (int, float)) and not isinstance(scalar, bool) else None,
        "status": _status_name(getattr(sample, "status", None)),
        "response_length": getattr(sample, "response_length", None),
    }


def _prompt_key(prompt: object) -> str | None:
    """Group by prompt text when there is no group index (slime eval samples share the prompt)."""
    if prompt is None:
        return None
    return prompt if isinstance(prompt, str) else repr(prompt)
