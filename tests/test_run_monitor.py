"""The offline rollout's view of its server's health, fed the client's retry events as they come."""

from __future__ import annotations

import re
import time

import pytest
from waiting import wait_until_sync

from strands_slime.provider.client import RetryEvent
from strands_slime.rollout.run_monitor import RunMonitor

pytestmark = pytest.mark.unit

SERVER = "http://127.0.0.1:9"
ERROR = f"HTTP 500 from {SERVER}/generate: engine on fire"


def _monitor(*, unhealthy_timeout_s: float, quiet: bool) -> RunMonitor:
    """The monitor of a run of 4 samples, 4 at a time, none done yet."""
    return RunMonitor(
        total=4,
        done=0,
        todo=4,
        concurrency=4,
        unhealthy_timeout_s=unhealthy_timeout_s,
        server=SERVER,
        quiet=quiet,
    )


def _server_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("server ")]


def test_replies_to_requests_sent_before_the_trouble_do_not_close_the_unhealthy_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # measured before this rule: a server turning to 5xx mid-run printed 15 "unhealthy" / "recovered
    # after 0 s" pairs in its first second, one per episode whose last reply was already on its way
    monitor = _monitor(unhealthy_timeout_s=300, quiet=False)
    try:
        monitor.retry_event(RetryEvent(1, "retrying", 1, 61, ERROR, 1.0))
        monitor.retry_event(RetryEvent(2, "retrying", 1, 61, ERROR, 1.0))
        monitor.sample_finished({"status": "completed"})
        monitor.retry_event(RetryEvent(1, "recovered", 2, 61, "", None))
        lines = _server_lines(capsys.readouterr().err)
        assert len(lines) == 1 and lines[0].endswith(f": 1 request retrying (retry 1 of 60): {ERROR}")
        assert lines[0].startswith("server unhealthy since ") and monitor.unhealthy_since is not None

        monitor.retry_event(RetryEvent(2, "recovered", 3, 61, "", None))  # the last one retrying
        assert _server_lines(capsys.readouterr().err) == ["server recovered after 0 s"]
        assert monitor.unhealthy_since is None and monitor.stop_reason is None

        # requests that gave up are no recovery; the next sample that succeeds is
        monitor.retry_event(RetryEvent(3, "retrying", 1, 61, ERROR, 1.0))
        monitor.retry_event(RetryEvent(3, "gave_up", 61, 61, ERROR, None))
        (line,) = _server_lines(capsys.readouterr().err)
        assert line.startswith("server unhealthy since ") and monitor.unhealthy_since is not None
        monitor.sample_finished({"status": "completed"})
        assert _server_lines(capsys.readouterr().err) == ["server recovered after 0 s"]
    finally:
        monitor.close()


def test_the_unhealthy_timeout_counts_from_the_last_success() -> None:
    # "failed every request for N s" must be true: a sample that succeeds while others retry restarts it
    timeout_s = 0.5
    monitor = _monitor(unhealthy_timeout_s=timeout_s, quiet=True)
    try:
        monitor.retry_event(RetryEvent(1, "retrying", 1, 61, ERROR, 1.0))
        since = monitor.unhealthy_since
        assert since is not None
        wait_until_sync(lambda: time.monotonic() - since >= timeout_s, what="the timeout to pass")
        monitor.sample_finished({"status": "completed"})
        monitor.tick()
        assert monitor.stop_reason is None and monitor.unhealthy_since == since, (
            "still unhealthy, not failing all"
        )

        def stopped() -> str | None:
            monitor.tick()
            return monitor.stop_reason

        reason = wait_until_sync(stopped, timeout=10, what="the stop")
        assert re.fullmatch(
            r"the server http://127\.0\.0\.1:9 failed every request for \d+ s "
            rf"\(--unhealthy-timeout 0\.5; latest: {re.escape(ERROR)}\)",
            reason,
        ), reason
        assert time.monotonic() - since >= 2 * timeout_s
    finally:
        monitor.close()
