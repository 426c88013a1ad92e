"""The fault-injection soak, small: 240 fault-phase episodes (one server kill, one slime-aborted step)
and 60 load-phase episodes. ``make soak`` runs the full one (docs/soak.md)."""

from __future__ import annotations

import pytest

from benchmarks import soak

pytestmark = pytest.mark.slow

_LOOP_GOAL = "loop blocking max with episodes in flight, loop-thread CPU (ms)"
_LOOP_REGRESSION_S = 0.15


@pytest.mark.slow  # about 40 s on 2 cores
async def test_soak_300_episodes_loses_nothing_and_breaks_nothing() -> None:
    results = await soak.run_soak(episodes=240, load_episodes=60, step_size=80, seed=1)
    report = soak.render_text(results)
    summary = soak.summarize(results)
    assert not results.escaped and not results.loop_errors, report
    assert not results.invalid, report
    statuses = sum(results.statuses["fault"].values()), sum(results.statuses["load"].values())
    assert statuses == (240, 60), report
    assert results.statuses["load"]["completed"] == 60, report  # latency alone fails nothing
    matrix = results.matrix
    # the documented outcomes (docs/soak.md)
    assert set(matrix["slime abort (running)"]) == {"aborted"}, report
    assert set(matrix["slime abort (not started yet)"]) <= {"aborted"}, report
    assert matrix["tool loop (iteration limit)"]["completed"] == 0, report  # always ends at the limit
    assert matrix["400 context error"]["completed"] == 0, report  # a context error ends the episode
    assert not results.unexplained_failures, report  # tool-side trouble never fails an episode
    assert matrix["no fault (scenario only)"]["failed"] == 0, report
    for scenario in ("tool call: malformed", "tool code: crash", "tool code: loop", "tool code: fork"):
        assert matrix[scenario]["completed"] > 0, (scenario, report)
    assert sum(matrix["server abort (abort_all)"].values()) > 0, report
    assert sum(matrix["server kill"].values()) > 0, report
    assert summary["trend"]["children"] <= 0 and summary["trend"]["tasks"] <= 0, report  # forks reaped
    unmet = [name for name, met in summary["met"].items() if met is False and name != _LOOP_GOAL]
    assert not unmet, report
    # The 50 ms loop goal is a benchmark target (`make soak`, docs/soak.md), not a CI gate: one CI run on
    # 2026-11-29 measured 56 ms once on a 2-core machine. CI guards against real blocking (a synchronous
    # tokenization of a long prompt, a blocking call on the loop), which costs several times that.
    assert summary["busy"] <= _LOOP_REGRESSION_S, report
    assert summary["busy_in_flight"] <= summary["busy"], report
    assert summary["stall"] > 0 and summary["busy"] > 0, report  # both were measured
