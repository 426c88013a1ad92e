"""slime dynamic-sampling filters: which GRPO groups are worth training on.

slime takes one ``--dynamic-sampling-filter-path``, so the two reasons to drop a group live in one
function here:

* ``drop_groups_with_infra_failures``: a removed sample (``remove_sample=True``) has no gradient, but
  slime still counts its preset reward in the group's mean and std, which shifts the advantages of
  its siblings. A sample the server aborted on its own (an operator's ``/abort_request``, a weight
  update outside fully-async rollouts) comes back ABORTED with no reward, which slime's advantage
  computation cannot take. Such groups are replaced instead.
* ``drop_infra_failures_and_zero_std`` adds DAPO's dynamic sampling: a group whose rewards are all
  equal (all right or all wrong) has zero advantage everywhere and only dilutes the batch, the same
  test as slime's ``slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std``,
  but on the unshaped score (``metadata["raw_reward"]``) when our reward function recorded it.

Both need ``--over-sampling-batch-size`` above ``--rollout-batch-size`` so slime has spare groups.
"""

from __future__ import annotations

import statistics
from typing import Any

from strands_slime.episode_metadata import EpisodeMetadata
from strands_slime.rollout.slime_compat import flatten, status_name

# slime's check_reward_nonzero_std threshold.
_MIN_REWARD_STD = 1e-6


def _reward_value(args: Any, sample: Any) -> float:
    """The unshaped score when our reward recorded it, so tool-use shaping cannot make an all-wrong
    group look informative; otherwise the reward slime itself would read."""
    raw = EpisodeMetadata.from_metadata(getattr(sample, "metadata", None)).raw_reward
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    reward = sample.reward
    key = getattr(args, "reward_key", None)
    if key and isinstance(reward, dict):
        reward = reward[key]
    return float(reward)


def _output(keep: bool, reason: str | None, keep_when_insufficient: bool) -> Any:
    try:
        from slime.rollout.filter_hub.base_types import DynamicFilterOutput
    except ImportError:
        return keep
    return DynamicFilterOutput(keep=keep, reason=reason, keep_when_insufficient=keep_when_insufficient)


def _lost(sample: Any) -> str | None:
    """Why ``sample`` cannot be trained on as part of its group, or None."""
    if status_name(sample) == "aborted":
        return "server_abort"
    if EpisodeMetadata.from_metadata(getattr(sample, "metadata", None)).infra_error:
        return "infra_failure"
    return None


def drop_groups_with_infra_failures(args: Any, samples: list[Any], **kwargs: Any) -> Any:
    """Keep a group only if none of its samples failed for infrastructure reasons or was aborted."""
    reasons = [reason for reason in map(_lost, flatten(samples)) if reason is not None]
    keep = not reasons
    # When too few groups are left to fill the batch, keep a group with removed samples (they are
    # masked anyway), but never one holding an unrewarded ABORTED sample.
    return _output(
        keep, reasons[0] if reasons else None, keep_when_insufficient="server_abort" not in reasons
    )


def drop_infra_failures_and_zero_std(args: Any, samples: list[Any], **kwargs: Any) -> Any:
    """DAPO dynamic sampling plus the infrastructure-failure filter, for one filter path.

    A group with an infrastructure failure is dropped (kept only if the batch cannot be filled
    otherwise); a group whose rewards have zero spread is dropped like slime's
    ``check_reward_nonzero_std`` does, which makes slime sample more prompts instead.
    """
    infra = drop_groups_with_infra_failures(args, samples, **kwargs)
    if not (infra if isinstance(infra, bool) else infra.keep):
        return infra
    rewards = [_reward_value(args, s) for s in flatten(samples)]
    keep = len(rewards) > 1 and statistics.stdev(rewards) > _MIN_REWARD_STD
    return _output(keep, None if keep else f"zero_std_{round(rewards[0], 1)}", keep_when_insufficient=False)
