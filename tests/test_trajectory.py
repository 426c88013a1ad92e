"""Token trajectory invariants, rollback and seed-compatible views."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strands_slime.provider.trajectory import TokenManager, TokenTrajectory


def build() -> TokenTrajectory:
    t = TokenTrajectory()
    t.begin_turn()
    t.add_prompt([1, 2, 3])
    t.add_output([4, 5], [-0.1, -0.2])
    t.begin_turn()
    t.add_prompt([6])
    t.add_output([7], [-0.3])
    return t


def test_views_and_invariants() -> None:
    t = build()
    t.check()
    assert t.token_ids == [1, 2, 3, 4, 5, 6, 7]
    assert t.loss_mask == [0, 0, 0, 1, 1, 0, 1]
    assert t.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.3]
    assert t.segments == [[1, 2, 3], [4, 5], [6], [7]]
    assert t.initial_prompt_length == 3 and t.response_length == 4
    assert t.response_slices() == ([4, 5, 6, 7], [1, 1, 0, 1], [-0.1, -0.2, 0.0, -0.3])
    assert t.last_output_ids() == [7] and t.num_outputs == 2 and t.output_token_count == 3
    assert TokenManager is TokenTrajectory


def test_rollback_removes_whole_turns() -> None:
    t = build()
    assert t.rollback_turns(1) == 2
    t.check()
    assert t.token_ids == [1, 2, 3, 4, 5] and t.turn_count == 1
    assert t.rollback_turns(5) == 0
    t.rollback_turns(0)
    assert len(t) == 0 and t.segments == []


def test_null_logprobs_are_counted() -> None:
    t = TokenTrajectory()
    t.begin_turn()
    t.add_prompt([1])
    t.add_output([2, 3], [None, float("nan")])
    assert t.missing_logprobs == 2 and all(math.isinf(v) for v in t.logprobs[1:])


def test_length_mismatch_is_rejected() -> None:
    t = TokenTrajectory()
    with pytest.raises(ValueError, match="2 output tokens but 1 logprobs"):
        t.add_output([1, 2], [-0.1])


def test_copy_is_independent() -> None:
    t = build()
    c = t.copy()
    c.rollback_turns(0)
    assert len(t) == 7 and len(c) == 0


@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 10), max_size=5),
            st.lists(st.integers(0, 10), min_size=1, max_size=5),
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, 6),
)
def test_random_turns_keep_invariants(turns: list[tuple[list[int], list[int]]], keep: int) -> None:
    t = TokenTrajectory()
    t.begin_turn()
    t.add_prompt([99])
    t.add_output([98], [-1.0])
    for prompt, output in turns:
        t.begin_turn()
        t.add_prompt(prompt)
        t.add_output(output, [-0.5] * len(output))
        t.check()
    t.rollback_turns(max(1, keep))
    t.check()
    assert sum(t.loss_mask) == t.output_token_count
