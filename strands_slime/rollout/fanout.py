"""Fan-out support: GRPO normalization when one episode yields several samples.

With ``fanout.enabled`` generate returns one sample per context segment, all sharing ``rollout_id``
and the episode's reward. slime's default reward post-processing reshapes rewards by
``n_samples_per_prompt``, which uneven fan-out breaks (it then normalizes over the whole batch), and
would count an episode once per segment. ``--custom-reward-post-process-path
strands_slime.rollout.fanout.normalize_by_group_index`` groups by ``group_index`` (the prompt) and counts each
episode once, then gives every segment its episode's advantage.
"""

from __future__ import annotations

import math
from typing import Any

GROUP_NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD_NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo")


def normalize_by_group_index(args: Any, samples: list[Any]) -> tuple[list[float], list[float]]:
    """``(raw_rewards, rewards)`` in ``samples`` order, as slime's ``_post_process_rewards`` returns.

    A fanned-out episode is several samples with one ``rollout_id``: it counts once in its group's
    mean and std (slime would count it once per segment), and every segment gets its advantage.

    Args:
        args: slime's args (``advantage_estimator``, ``rewards_normalization``,
            ``grpo_std_normalization``, and what ``Sample.get_reward_value`` reads).
        samples: the rollout's samples; ``group_index`` groups them, ``rollout_id`` joins segments.
    """
    raw = [float(sample.get_reward_value(args)) for sample in samples]
    estimator = getattr(args, "advantage_estimator", "grpo")
    if estimator not in GROUP_NORMALIZED_ESTIMATORS or not getattr(args, "rewards_normalization", True):
        return raw, list(raw)
    use_std = estimator in STD_NORMALIZED_ESTIMATORS and getattr(args, "grpo_std_normalization", True)
    episodes: dict[Any, dict[Any, float]] = {}  # group -> episode -> reward
    for position, sample in enumerate(samples):
        episode = sample.rollout_id if sample.rollout_id is not None else ("sample", position)
        episodes.setdefault(sample.group_index, {}).setdefault(episode, raw[position])
    advantage: dict[tuple[Any, Any], float] = {}
    for group, rewards in episodes.items():
        values = list(rewards.values())
        mean = sum(values) / len(values)
        centered = [value - mean for value in values]
        if use_std:
            # torch.std's default (Bessel-corrected); a single episode has no spread to divide by
            std = math.sqrt(sum(c * c for c in centered) / (len(values) - 1)) if len(values) > 1 else 0.0
            centered = [c / (std + 1e-6) for c in centered]
        for episode, value in zip(rewards, centered, strict=True):
            advantage[(group, episode)] = value
    normalized = []
    for position, sample in enumerate(samples):
        episode = sample.rollout_id if sample.rollout_id is not None else ("sample", position)
        normalized.append(advantage[(sample.group_index, episode)])
    return raw, normalized
