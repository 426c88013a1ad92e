"""slime dynamic-sampling filter: drop GRPO groups that lost a sample to an infrastructure failure.

A removed sample (``remove_sample=True``) has no gradient, but slime still counts its preset reward in
the group's mean and std, which shifts the advantages of its siblings. With
``--dynamic-sampling-filter-path strands_slime.filters.drop_groups_with_infra_failures`` (and
``--over-sampling-batch-size`` above ``--rollout-batch-size``) slime replaces such groups instead.
"""

from __future__ import annotations

from typing import Any


def drop_groups_with_infra_failures(args: Any, samples: list[Any], **kwargs: Any) -> Any:
    """Keep a group only if none of its samples failed for infrastructure reasons."""
    failed = sum(1 for s in samples if (getattr(s, "metadata", None) or {}).get("infra_error"))
    keep = failed == 0
    reason = None if keep else "infra_failure"
    try:
        from slime.rollout.filter_hub.base_types import DynamicFilterOutput
    except ImportError:
        return keep
    # When too few groups are left to fill the batch, keep it: the failed samples are masked anyway.
    return DynamicFilterOutput(keep=keep, reason=reason, keep_when_insufficient=True)
