"""strands_slime.rollout.filters against slime's own dynamic-sampling filter and filter plumbing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from slime_upstream import require_slime

from strands_slime.rollout.filters import drop_groups_with_infra_failures, drop_infra_failures_and_zero_std

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def slime_filters() -> SimpleNamespace:
    require_slime()
    from slime.rollout.filter_hub import dynamic_sampling_filters
    from slime.rollout.filter_hub.base_types import should_drop_dynamic_filter_output
    from slime.utils.types import Sample

    return SimpleNamespace(
        nonzero_std=dynamic_sampling_filters.check_reward_nonzero_std,
        should_drop=should_drop_dynamic_filter_output,
        Sample=Sample,
    )


def _group(slime_filters: SimpleNamespace, rewards: list, infra: tuple[int, ...] = ()) -> list:
    group = []
    for index, reward in enumerate(rewards):
        sample = slime_filters.Sample(index=index, reward=reward)
        if index in infra:
            sample.metadata = {"infra_error": "sglang: connection refused"}
            sample.remove_sample = True
        group.append(sample)
    return group


GROUPS = [
    [1.0] * 8,
    [-1.0] * 8,
    [1.0] + [-1.0] * 7,
    [-1.0, -1.0, -0.9999999, -1.0],
    [-1.1, -1.0, -0.95, -0.9, -0.85, -0.85],
    [0.5],
]


@pytest.mark.parametrize("rewards", GROUPS)
def test_zero_std_decision_matches_slimes_filter(slime_filters: SimpleNamespace, rewards: list) -> None:
    args = SimpleNamespace(reward_key=None)
    group = _group(slime_filters, rewards)
    ours = drop_infra_failures_and_zero_std(args, group)
    theirs = slime_filters.nonzero_std(args, group)
    assert bool(ours.keep) == bool(theirs.keep)
    assert ours.reason == theirs.reason


def test_reward_key_selects_the_scalar(slime_filters: SimpleNamespace) -> None:
    args = SimpleNamespace(reward_key="score")
    same = _group(slime_filters, [{"score": 1.0, "acc": True}, {"score": 1.0, "acc": True}])
    mixed = _group(slime_filters, [{"score": 1.0, "acc": True}, {"score": -1.0, "acc": False}])
    assert drop_infra_failures_and_zero_std(args, same).keep is False
    assert drop_infra_failures_and_zero_std(args, mixed).keep is True


def test_infra_failures_are_dropped_first_and_kept_only_when_the_batch_needs_them(
    slime_filters: SimpleNamespace,
) -> None:
    args = SimpleNamespace(reward_key=None)
    group = _group(slime_filters, [1.0, -1.0, 0.0, -1.0], infra=(2,))
    output = drop_infra_failures_and_zero_std(args, group)
    assert output.keep is False and output.reason == "infra_failure"
    # slime's own rule: dropped while spare groups remain, kept when the batch cannot be filled.
    assert slime_filters.should_drop(output, remaining_batch_size=20, target_data_size=16)
    assert not slime_filters.should_drop(output, remaining_batch_size=16, target_data_size=16)
    zero_std = drop_infra_failures_and_zero_std(args, _group(slime_filters, [-1.0] * 4))
    assert slime_filters.should_drop(zero_std, remaining_batch_size=16, target_data_size=16)


def test_fanned_out_episodes_count_every_sample(slime_filters: SimpleNamespace) -> None:
    args = SimpleNamespace(reward_key=None)
    first = _group(slime_filters, [1.0, 1.0])
    second = _group(slime_filters, [-1.0])
    assert drop_infra_failures_and_zero_std(args, [first, second]).keep is True
    failed = _group(slime_filters, [1.0], infra=(0,))
    assert drop_groups_with_infra_failures(args, [first, failed]).keep is False


def test_shaped_all_wrong_groups_are_judged_on_the_unshaped_score(slime_filters: SimpleNamespace) -> None:
    # strands_example shaping gives wrong answers -1.1 .. -0.85 by tool count: slime's own check sees
    # spread, ours sees the all-wrong group it is.
    args = SimpleNamespace(reward_key=None)
    group = _group(slime_filters, [-1.1, -1.05, -1.0, -0.95, -0.9, -0.85])
    for sample in group:
        sample.metadata = {"raw_reward": -1.0}
    assert slime_filters.nonzero_std(args, group).keep
    output = drop_infra_failures_and_zero_std(args, group)
    assert output.keep is False and output.reason == "zero_std_-1.0"
