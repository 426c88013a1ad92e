"""Fan-out support: GRPO normalization when one episode yields several samples.

With fan-out or several agents, an episode's samples share ``rollout_id`` and its reward. slime's
default post-processing reshapes rewards by ``n_samples_per_prompt``, which uneven counts break, and
would count an episode once per sample; :func:`normalize_by_group_index` normalizes within each group
over episodes, each once (an agent with its own reward on its own track), and gives every sample its
episode's advantage. See docs/rollout.md, "GRPO: an episode counts once".
"""

from __future__ import annotations

import math
from typing import Any

GROUP_NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD_NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo")


def normalize_by_group_index(args: Any, samples: list[Any]) -> tuple[list[float], list[float]]:
    """``(raw_rewards, rewards)`` in ``samples`` order, as slime's ``_post_process_rewards`` returns.

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
    episodes: dict[Any, dict[Any, float]] = {}  # (group, reward track) -> episode -> reward
    keys = [_episode_key(sample, position) for position, sample in enumerate(samples)]
    for position, (group, episode) in enumerate(keys):
        episodes.setdefault(group, {}).setdefault(episode, raw[position])
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
    return raw, [advantage[key] for key in keys]


def _episode_key(sample: Any, position: int) -> tuple[tuple[Any, Any], Any]:
    """``((group, reward track), episode)``: samples of one episode on one track count once."""
    episode = sample.rollout_id if sample.rollout_id is not None else ("sample", position)
    metadata = getattr(sample, "metadata", None) or {}
    return (sample.group_index, metadata.get("reward_track")), episode
