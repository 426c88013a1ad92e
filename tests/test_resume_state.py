"""The pieces of a saved episode state: the trajectory layout and the limiter counters."""

from __future__ import annotations

import json
from typing import Any

import pytest

from strands_slime.provider.limits import ToolLimiter
from strands_slime.provider.trajectory import TokenTrajectory

pytestmark = pytest.mark.unit


def trajectory() -> TokenTrajectory:
    built = TokenTrajectory()
    built.begin_turn()
    built.add_prompt([1, 2, 3])
    built.add_output([4, 5], [-0.5, None])
    built.begin_turn()
    built.add_prompt([6])
    built.add_output([7, 8, 9], [-0.1, -0.2, -0.3])
    return built


def test_layout_round_trip_rebuilds_the_trajectory_from_the_samples_ids_and_logprobs() -> None:
    original = trajectory()
    layout = json.loads(json.dumps(original.layout()))  # plain JSON
    # what a slime Sample holds: all ids, and logprobs of the response (0.0 where none was sent)
    response_logprobs = [0.0 if lp == float("-inf") else lp for lp in original.logprobs[3:]]
    rebuilt = TokenTrajectory.from_layout(original.token_ids.tolist(), response_logprobs, layout)
    rebuilt.check()
    assert rebuilt.token_ids.tolist() == original.token_ids.tolist()
    assert rebuilt.loss_mask.tolist() == original.loss_mask.tolist()
    assert [(s.kind, s.start, s.length) for s in rebuilt.segment_info] == [
        (s.kind, s.start, s.length) for s in original.segment_info
    ]
    assert rebuilt.turn_count == 2 and rebuilt.missing_logprobs == 1
    assert rebuilt.logprobs[3:].tolist() == response_logprobs and rebuilt.logprobs[:3].tolist() == [0.0] * 3
    assert rebuilt.rollback_turns(1) == 4 and rebuilt.token_ids.tolist() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda layout: layout["segments"].append(["output", 1]), "covers 10 tokens"),
        (lambda layout: layout["segments"].__setitem__(1, ["weird", 2]), "bad saved segment"),
        (lambda layout: layout["segments"].__setitem__(0, ["output", 3]), "covers"),
        (lambda layout: layout["turns"].append([99, 1]), "bad saved turn"),
        (lambda layout: layout.pop("segments"), "segments"),
    ],
)
def test_a_layout_that_does_not_fit_is_refused(change: Any, message: str) -> None:
    original = trajectory()
    layout = original.layout()
    change(layout)
    with pytest.raises((ValueError, KeyError), match=message):
        TokenTrajectory.from_layout(original.token_ids, [0.0] * 6, layout)


def test_logprobs_must_cover_the_response() -> None:
    original = trajectory()
    with pytest.raises(ValueError, match="5 logprobs for 6 response tokens"):
        TokenTrajectory.from_layout(original.token_ids, [0.0] * 5, original.layout())


def test_limiter_counters_carry_over_and_bad_ones_are_refused() -> None:
    limiter = ToolLimiter(3, 5, max_model_calls=8)
    limiter.tool_iter_count, limiter.tool_call_count, limiter.model_call_count = 2, 3, 4
    resumed = ToolLimiter(3, 5, max_model_calls=8)
    resumed.restore_counters(json.loads(json.dumps(limiter.counters())))
    assert resumed.counters() == {"tool_iter_count": 2, "tool_call_count": 3, "model_call_count": 4}
    with pytest.raises(ValueError, match="negative"):
        resumed.restore_counters({"tool_iter_count": -1, "tool_call_count": 0, "model_call_count": 0})
    with pytest.raises(KeyError):
        resumed.restore_counters({"tool_iter_count": 1})
