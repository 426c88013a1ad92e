"""An abort flag whose read raises: the watcher keeps the request, says so once per process and counts
every failed read in the rollout metrics (not one log line per 50 ms poll)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from strands_slime.aborts import ABORT_POLL_S, abort_check_failures, run_abortable
from strands_slime.rollout.metrics import compute_rollout_metrics
from strands_slime.rollout.slime_compat import Sample

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _fresh_process() -> None:
    """Each test sees a process in which no abort check has failed yet (the warning is once per process):
    the runtime holds the counter and the logged-once set, and every test starts with an empty runtime."""
    assert abort_check_failures() == 0


def _breaks_after_first_read(message: str) -> Callable[[], bool]:
    """A flag that reads fine when the request starts, then raises (e.g. slime's state torn down)."""
    reads = 0

    def check() -> bool:
        nonlocal reads
        reads += 1
        if reads > 1:
            raise RuntimeError(message)
        return False

    return check


async def _until(condition: Callable[[], bool], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {deadline_s} s")
        await asyncio.sleep(ABORT_POLL_S / 5)


async def test_a_failing_abort_check_is_logged_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="strands_slime.aborts")
    for message in ("state torn down", "another cause"):
        done = asyncio.Event()
        request = asyncio.ensure_future(run_abortable(done.wait(), _breaks_after_first_read(message)))
        before = abort_check_failures()
        await _until(lambda before=before: abort_check_failures() >= before + 3, deadline_s=10)
        done.set()
        assert await asyncio.wait_for(request, 10) is True, "the request is neither cancelled nor failed"
    lines = [r for r in caplog.records if "abort detection failed" in r.getMessage()]
    assert len(lines) == 1, "one line per process, not one per poll"
    assert lines[0].levelno == logging.WARNING
    assert "RuntimeError: state torn down" in lines[0].getMessage()
    failures = abort_check_failures()
    assert failures >= 6
    metrics = compute_rollout_metrics([Sample(metadata={})])
    assert metrics["abort_detection/failed_checks"] == float(failures)


async def test_no_failures_is_logged_as_zero(caplog: pytest.LogCaptureFixture) -> None:
    assert await run_abortable(asyncio.sleep(3 * ABORT_POLL_S, result="ok"), lambda: False) == "ok"
    assert compute_rollout_metrics([Sample(metadata={})])["abort_detection/failed_checks"] == 0.0
    assert not [r for r in caplog.records if "abort detection failed" in r.getMessage()]
