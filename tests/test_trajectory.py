"""Token trajectory invariants, rollback and seed-compatible views."""

from __future__ import annotations

import array
import gc
import math
import pickle
import random
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strands_slime.provider.trajectory import MAX_TOKEN_ID, TokenManager, TokenTrajectory

pytestmark = pytest.mark.unit


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
    assert t.token_ids.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert t.loss_mask.tolist() == [0, 0, 0, 1, 1, 0, 1]
    assert t.logprobs.tolist() == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.3]
    assert t.segments == [[1, 2, 3], [4, 5], [6], [7]]
    assert t.initial_prompt_length == 3 and t.response_length == 4
    assert t.response_slices() == ([4, 5, 6, 7], [1, 1, 0, 1], [-0.1, -0.2, 0.0, -0.3])
    assert t.last_output_ids() == [7] and t.num_outputs == 2 and t.output_token_count == 3
    assert TokenManager is TokenTrajectory


def test_rollback_removes_whole_turns() -> None:
    t = build()
    assert t.rollback_turns(1) == 2
    t.check()
    assert t.token_ids.tolist() == [1, 2, 3, 4, 5] and t.turn_count == 1
    assert t.loss_mask.tolist() == [0, 0, 0, 1, 1] and t.logprobs.tolist() == [0.0, 0.0, 0.0, -0.1, -0.2]
    assert t.segments == [[1, 2, 3], [4, 5]] and t.last_output_ids() == [4, 5]
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
    assert c == t and c.token_ids is not t.token_ids
    c.rollback_turns(0)
    assert len(t) == 7 and len(c) == 0
    c = t.copy()
    c.begin_turn()
    c.add_prompt([8])
    c.add_output([9], [None])
    c.logprobs[3] = -9.0
    assert t.token_ids.tolist() == [1, 2, 3, 4, 5, 6, 7] and t.logprobs[3] == -0.1
    assert t.turn_count == 2 and t.missing_logprobs == 0 and len(t.segment_info) == 4
    t.check()
    c.check()


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


# --------------------------------------------------------------------------- storage (arrays)


def long_episode(seed: int = 0) -> TokenTrajectory:
    """A tool episode of ~5k tokens with real-looking ids and float64 logprobs (a few null)."""
    rng = random.Random(seed)
    t = TokenTrajectory()
    for turn in range(6):
        t.begin_turn()
        t.add_prompt([rng.randrange(151_000) for _ in range(rng.randrange(200, 900))])
        ids = [rng.randrange(151_000) for _ in range(rng.randrange(50, 400))]
        logprobs = [None if turn == 2 and i % 50 == 0 else -rng.expovariate(3.0) for i in range(len(ids))]
        t.add_output(ids, logprobs, {"id": f"call-{turn}", "finish_reason": {"type": "stop"}})
    return t


def collector_edges(value: object) -> int:
    """References the cyclic garbage collector follows from ``value`` (0 when it does not track it)."""
    return len(gc.get_referents(value)) if gc.is_tracked(value) else 0


def test_the_collector_does_not_walk_the_tokens() -> None:
    """CPython >= 3.10 tracks an ``array`` only to reach its type: one edge, whatever its length. A list
    is an edge per element (and a float object per logprob), which is what each full collection walked."""
    t = long_episode()
    assert len(t) > 3_000
    for values in (t.token_ids, t.loss_mask, t.logprobs):
        assert collector_edges(values) <= 1 and gc.get_referents(values) in ([], [type(values)])
    assert collector_edges(t.logprobs.tolist()) == len(t)
    assert (t.token_ids.typecode, t.loss_mask.typecode, t.logprobs.typecode) == ("i", "b", "d")
    assert (t.token_ids.itemsize, t.loss_mask.itemsize, t.logprobs.itemsize) == (4, 1, 8)
    for kept in (t.copy(), pickle.loads(pickle.dumps(t))):
        assert all(collector_edges(v) <= 1 for v in (kept.token_ids, kept.loss_mask, kept.logprobs))
    t.rollback_turns(3)
    t.reset()
    assert all(collector_edges(v) <= 1 for v in (t.token_ids, t.loss_mask, t.logprobs))
    t.check()


def test_values_round_trip_exactly() -> None:
    ids = [0, 1, 255, 256, 151_643, MAX_TOKEN_ID]
    # float64 values a float32 store would change, the smallest subnormal, -0.0, and -inf as sent
    logprobs = [-1e-300, -0.1, -(2**-1074), -0.0, -math.inf, -1234.5678901234567]
    assert struct.unpack("f", struct.pack("f", -0.1))[0] != -0.1
    t = TokenTrajectory()
    t.begin_turn()
    t.add_prompt([7])
    t.add_output(ids, logprobs)
    assert t.token_ids.tolist() == [7, *ids]
    assert t.logprobs.tolist()[1:] == logprobs and math.copysign(1.0, t.logprobs[4]) == -1.0
    assert t.missing_logprobs == 0, "-inf from the server is a value, not a missing one"
    response_ids, mask, response_logprobs = t.response_slices()
    assert type(response_ids) is type(mask) is type(response_logprobs) is list
    assert response_ids == ids and mask == [1] * 6 and response_logprobs == logprobs
    assert all(type(v) is int for v in response_ids) and all(type(v) is float for v in response_logprobs)


def test_null_and_nan_logprobs_become_minus_inf_in_order() -> None:
    t = TokenTrajectory()
    t.begin_turn()
    t.add_prompt([1])
    t.add_output([2, 3, 4, 5], [-0.5, None, -0.25, float("nan")])
    t.add_output([6, 7], [-math.inf, math.inf])  # the sum is NaN: the slow path keeps both values
    assert t.logprobs.tolist() == [0.0, -0.5, -math.inf, -0.25, -math.inf, -math.inf, math.inf]
    assert t.missing_logprobs == 2
    t.check()


@pytest.mark.parametrize(
    ("ids", "error", "message"),
    [
        ([5, -1], ValueError, r"token ids must be in \[0, 2147483647\]; got \[-1\]"),
        ([2**31], ValueError, r"got \[2147483648\]"),
        ([2**32], ValueError, r"got \[4294967296\]"),
        ([2**70], ValueError, r"got \[1180591620717411303424\]"),
        (array.array("i", [3, -7]), ValueError, r"got \[-7\]"),
        (array.array("q", [3, 2**40]), ValueError, r"got \[1099511627776\]"),
        ([1.5], TypeError, "token ids must be integers"),
        (["7"], TypeError, "token ids must be integers"),
        ([None], TypeError, "token ids must be integers"),
    ],
)
def test_bad_ids_are_refused_and_nothing_is_added(ids: list[object], error: type, message: str) -> None:
    t = build()
    before = t.copy()
    with pytest.raises(error, match=message):
        t.add_prompt(ids)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        t.add_output(ids, [-0.1] * len(ids))  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        TokenTrajectory(token_ids=ids)  # type: ignore[arg-type]
    assert t == before
    t.check()


def test_a_logprob_that_is_not_a_number_is_refused_and_nothing_is_added() -> None:
    t = build()
    before = t.copy()
    with pytest.raises(TypeError, match="logprobs must be real numbers or null"):
        t.add_output([8, 9], [-0.1, "x"])  # type: ignore[list-item]
    assert t == before


def test_lists_given_to_the_constructor_become_arrays() -> None:
    t = TokenTrajectory(token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -0.5])  # type: ignore[arg-type]
    assert (t.token_ids.typecode, t.loss_mask.typecode, t.logprobs.typecode) == ("i", "b", "d")
    assert (
        t.token_ids.tolist() == [1, 2]
        and t.loss_mask.tolist() == [0, 1]
        and t.logprobs.tolist() == [0.0, -0.5]
    )
    with pytest.raises(ValueError, match="the loss mask must hold 0s and 1s"):
        TokenTrajectory(loss_mask=[1000])  # type: ignore[arg-type]


def test_check_refuses_a_list_put_in_place_of_an_array() -> None:
    t = build()
    t.token_ids = t.token_ids.tolist()  # type: ignore[assignment]
    with pytest.raises(AssertionError, match="not an array"):
        t.check()


def test_pickle_round_trips_and_stays_compact() -> None:
    t = long_episode(1)
    again = pickle.loads(pickle.dumps(t, protocol=5))
    assert again == t and again.token_ids.typecode == "i" and again.logprobs.tolist() == t.logprobs.tolist()
    assert again.missing_logprobs == t.missing_logprobs > 0 and again.turn_count == t.turn_count
    again.check()
    assert again.rollback_turns(2) == len(t) - t.turn_start(2).token_count
    # one block of bytes per array: ~13 bytes per token, not a pickled object per element
    assert len(pickle.dumps(t, protocol=5)) < 14 * len(t) + 4_000


def test_layout_round_trip_of_a_long_episode() -> None:
    t = long_episode(2)
    prompt = t.initial_prompt_length
    sample_logprobs = [0.0 if math.isinf(v) else v for v in t.logprobs.tolist()[prompt:]]
    rebuilt = TokenTrajectory.from_layout(t.token_ids.tolist(), sample_logprobs, t.layout())
    rebuilt.check()
    assert rebuilt.token_ids == t.token_ids and rebuilt.loss_mask == t.loss_mask
    assert rebuilt.logprobs.tolist()[prompt:] == sample_logprobs
    with pytest.raises(ValueError, match="token ids must be in"):
        TokenTrajectory.from_layout([-1, *t.token_ids.tolist()[1:]], sample_logprobs, t.layout())
