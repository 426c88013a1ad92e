"""strands_slime.reward.eval_metrics: pass@k, avg@k and summaries of evaluation records."""

from __future__ import annotations

import enum
import itertools
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strands_slime.reward.eval_metrics import (
    avg_at_k,
    pass_at_k,
    powers_of_two_up_to,
    record_from_sample,
    summarize,
    summarize_by,
)

pytestmark = pytest.mark.unit


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """The fraction of all k-subsets of n samples (c correct) that contain a correct one."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(subset) for subset in subsets) / len(subsets)


@given(st.integers(1, 10).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_enumerating_all_subsets(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_known_values() -> None:
    assert pass_at_k(16, 0, 16) == 0.0
    assert pass_at_k(16, 1, 16) == 1.0
    assert pass_at_k(16, 4, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    assert 0.0 < pass_at_k(5000, 3, 100) < 1.0  # exact big-integer arithmetic, no overflow


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass_at_k needs"):
        pass_at_k(n, c, k)


def test_pass_at_k_rejects_non_integers() -> None:
    with pytest.raises(TypeError, match="k must be an int"):
        pass_at_k(4, 1, 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="c must be an int"):
        pass_at_k(4, True, 1)


def test_avg_at_k_weighs_prompts_equally() -> None:
    assert avg_at_k([[True, False], [True, True, True, True]]) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="no samples"):
        avg_at_k([[True], []])
    with pytest.raises(ValueError, match="no prompt groups"):
        avg_at_k([])


def test_powers_of_two() -> None:
    assert powers_of_two_up_to(16) == [1, 2, 4, 8, 16]
    assert powers_of_two_up_to(12) == [1, 2, 4, 8]
    assert powers_of_two_up_to(0) == []


def make_records(correct_per_prompt: list[list[bool]], **extra: object) -> list[dict[str, object]]:
    return [
        {
            "group": f"p{group}",
            "correct": correct,
            "reward": 1.0 if correct else -1.0,
            "status": "completed",
            **extra,
        }
        for group, outcomes in enumerate(correct_per_prompt)
        for correct in outcomes
    ]


def test_summarize_aime_style() -> None:
    outcomes = [[True] * 4, [True, False, False, False], [False] * 4]
    summary = summarize(make_records(outcomes))
    assert summary.num_prompts == 3 and summary.num_samples == summary.num_scored == 12
    assert summary.accuracy == pytest.approx(5 / 12)
    assert summary.avg_at_n == pytest.approx((1 + 0.25 + 0) / 3)
    assert sorted(summary.pass_at) == [1, 2, 4]
    assert summary.pass_at[1] == pytest.approx(summary.avg_at_n)
    assert summary.pass_at[2] == pytest.approx((1 + 0.5 + 0) / 3)
    assert summary.pass_at[4] == pytest.approx(2 / 3)
    assert summary.mean_reward == pytest.approx((5 - 7) / 12)
    flat = summary.as_dict()
    assert flat["avg@4"] == summary.avg_at_n and flat["pass@4"] == summary.pass_at[4]
    assert flat["status/completed"] == 12
    table = summary.render_markdown("aime")
    assert table.startswith("| aime | value |") and "| pass@2 | 0.5000 |" in table


def test_accuracy_is_acc_not_reward() -> None:
    records = [
        {"group": 0, "acc": True, "reward": 0.3},
        {"group": 0, "acc": False, "reward": 1.0},
    ]
    summary = summarize(records)
    assert summary.accuracy == 0.5 and summary.mean_reward == pytest.approx(0.65)


def test_aborted_and_unscored_records_are_counted_but_not_scored() -> None:
    records = make_records([[True, False]])
    records.append({"group": "p0", "correct": None, "status": "aborted"})
    records.append({"group": "p0", "status": "failed"})
    records.append({"group": "p0", "correct": False, "status": "truncated"})
    summary = summarize(records)
    assert (summary.num_samples, summary.num_scored, summary.excluded, summary.unscored) == (5, 3, 1, 1)
    assert summary.status_counts == {"completed": 2, "aborted": 1, "failed": 1, "truncated": 1}
    assert summary.truncated_ratio == pytest.approx(1 / 3)
    assert summary.accuracy == pytest.approx(1 / 3)
    # Aborted samples can be included on request (they then need correctness like any other).
    assert summarize(records, exclude_statuses=()).unscored == 2


def test_uneven_groups_limit_k_to_the_smallest() -> None:
    summary = summarize(make_records([[True] * 8, [False, True, False]]))
    assert sorted(summary.pass_at) == [1, 2]
    assert (summary.min_samples_per_prompt, summary.max_samples_per_prompt) == (3, 8)
    with pytest.raises(ValueError, match=r"1\.\.3"):
        summarize(make_records([[True] * 8, [False, True, False]]), ks=[4])
    assert sorted(summarize(make_records([[True] * 8]), ks=[3, 1]).pass_at) == [1, 3]


def test_summarize_rejects_bad_records() -> None:
    with pytest.raises(ValueError, match="record 1 has no prompt group id"):
        summarize([{"group": 0, "correct": True}, {"correct": True}])
    with pytest.raises(TypeError, match="record 0 is list"):
        summarize([[0, True]])  # type: ignore[list-item]


def test_summarize_empty() -> None:
    summary = summarize([])
    assert summary.num_prompts == 0 and summary.accuracy is None and summary.pass_at == {}


def test_summarize_by_dataset() -> None:
    records = make_records([[True, True]], dataset="aime") + make_records([[False, False]], dataset="math")
    summaries = summarize_by(records)
    assert set(summaries) == {"aime", "math"}
    assert summaries["aime"].accuracy == 1.0 and summaries["math"].accuracy == 0.0


class Status(enum.Enum):
    COMPLETED = "completed"
    ABORTED = "aborted"


def test_record_from_sample_prefers_our_acc() -> None:
    shaped_wrong = SimpleNamespace(
        group_index=3,
        index=7,
        reward=-0.85,
        status=Status.COMPLETED,
        response_length=100,
        metadata={"reward_details": {"acc": False}},
    )
    record = record_from_sample(shaped_wrong)
    assert record == {
        "group": 3,
        "index": 7,
        "correct": False,
        "reward": -0.85,
        "status": "completed",
        "response_length": 100,
    }
    dict_reward = SimpleNamespace(prompt="What is 6*7?", reward={"score": 1.0, "acc": True}, metadata={})
    record = record_from_sample(dict_reward)
    assert record["correct"] is True and record["reward"] == 1.0 and record["group"] == "What is 6*7?"
    foreign = SimpleNamespace(group_index=0, reward=1, metadata=None)
    assert record_from_sample(foreign)["correct"] is True
    aborted = SimpleNamespace(group_index=0, reward=None, status=Status.ABORTED, metadata={})
    assert record_from_sample(aborted)["correct"] is None
    summary = summarize([record_from_sample(s) for s in (shaped_wrong, foreign, aborted)])
    assert summary.excluded == 1 and summary.num_prompts == 2
    with pytest.raises(TypeError, match="must be a mapping, got list"):
        record_from_sample(SimpleNamespace(group_index=0, reward=1.0, metadata=["reward_details"]))
