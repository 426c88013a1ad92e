"""A step's cost beyond the groups slime keeps: every episode counted by the sample hook, the kept and
dropped groups, and the one record line per step that the launch pilot reads back
(``tests/test_pilot.py`` reads it)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from strands_slime.rollout.metrics import (
    STEP_RECORD_PREFIX,
    count_episode,
    log_rollout,
    step_metrics,
    take_step_tally,
)
from strands_slime.rollout.slime_compat import Sample

pytestmark = pytest.mark.unit

ARGS = SimpleNamespace(n_samples_per_prompt=2)


def _sample(status: str, length: int, group: int, **metadata: Any) -> Sample:
    sample = Sample(group_index=group, response_length=length, metadata=dict(metadata))
    sample.status = Sample.Status(status)
    return sample


def _step_3() -> tuple[list[Sample], list[Sample]]:
    """Group 0 kept, group 1 dropped by the filter (both wrong), group 2 cut off by the abort."""
    kept = [_sample("completed", 100, 0), _sample("truncated", 400, 0, truncation="response_budget")]
    dropped = [_sample("completed", 50, 1, resumes=1), _sample("truncated", 70, 1, truncation="tool_limit")]
    aborted = [_sample("aborted", 30, 2), _sample("aborted", 0, 2)]
    for sample in [*kept, *dropped, *aborted]:
        count_episode(ARGS, sample, rollout_id=3)
    return kept, dropped


def _logged_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(STEP_RECORD_PREFIX)]


def test_every_episode_of_the_step_is_counted_whatever_its_group_became(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="strands_slime.rollout.metrics")
    kept, _ = _step_3()
    count_episode(ARGS, _sample("completed", 999, 7), rollout_id=3, evaluation=True)  # not counted
    extra = {"rollout/dynamic_filter/drop_zero_std_-1.0": 1, "rollout/other": 5}
    assert log_rollout(3, ARGS, kept, extra, 10.0) is False
    (line,) = _logged_records(caplog)
    assert line.startswith(f"{STEP_RECORD_PREFIX} 3: ")
    record = json.loads(line.split(": ", 1)[1])
    step = {k.removeprefix("rollout/strands/step/"): v for k, v in record.items() if "/step/" in k}
    assert step == {
        "groups_kept": 1.0,
        "groups_dropped": 1.0,
        "keep_rate": 0.5,
        "rollout_seconds": 10.0,
        "episodes": 6.0,
        "completed": 2.0,
        "truncated": 2.0,
        "aborted": 2.0,
        "failed": 0.0,
        "length_truncated": 1.0,  # the budget cut one off; the other hit the tool limit
        "aborted_ratio": pytest.approx(2 / 6),
        "truncated_ratio": 0.5,
        "ended_tokens": 620.0,
        "aborted_tokens": 30.0,
        "ended_tokens_per_s": 62.0,
        "resumed": 1.0,
    }
    # the kept groups' own metrics are still there
    assert record["rollout/strands/samples"] == 2.0
    assert take_step_tally(3) is None, "the step's counts are used once"


def test_without_the_hook_the_step_still_reports_kept_and_dropped_groups(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="strands_slime.rollout.metrics")
    kept = [_sample("completed", 10, 4), _sample("completed", 10, 4)]
    log_rollout(0, ARGS, kept, {"rollout/dynamic_filter/drop_zero_std_1.0": 3}, 2.0)
    record = json.loads(_logged_records(caplog)[0].split(": ", 1)[1])
    assert record["rollout/strands/step/keep_rate"] == 0.25
    assert "rollout/strands/step/episodes" not in record


def test_groups_without_an_index_are_counted_by_size() -> None:
    samples = [Sample(), Sample(), Sample(), Sample()]
    assert step_metrics(samples, None, 1.0, None, group_size=2)["step/groups_kept"] == 2.0


def test_older_tallies_are_dropped_with_the_step_that_is_logged() -> None:
    count_episode(ARGS, _sample("completed", 1, 0), rollout_id=1)
    count_episode(ARGS, _sample("completed", 1, 0), rollout_id=2)
    count_episode(ARGS, _sample("completed", 1, 0), rollout_id=5)
    tally = take_step_tally(2)
    assert tally is not None and tally.statuses["completed"] == 1
    assert take_step_tally(1) is None, "an older step left behind is forgotten"
    assert take_step_tally(5) is not None


def test_a_sample_that_cannot_be_read_is_not_counted_and_nothing_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        @property
        def metadata(self) -> dict[str, Any]:
            raise RuntimeError("unreadable")

    count_episode(ARGS, Broken(), rollout_id=9)
    assert "counting an episode failed" in caplog.text
    assert take_step_tally(9) is None
