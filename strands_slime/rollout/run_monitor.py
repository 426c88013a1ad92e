"""What a person watching an offline rollout sees while it runs, and when the run stops on its own.

A server that fails requests shows at once as one line, repeated every :data:`REPEAT_EVERY_S` while it
lasts and closed once it recovers (the client reports retries on
:data:`~strands_slime.provider.client.retry_logger`). The run stops early, with one reason, once every
request in flight has failed (at least :data:`MIN_FAILURES_IN_A_ROW` failed samples in a row) or the
server has failed every request for ``unhealthy_timeout_s``. Warnings go to the run's log file, never
between the progress bar's lines. See docs/rollout.md (``server unhealthy since``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from strands_slime.episode_metadata import EpisodeMetadata
from strands_slime.provider.client import RetryEvent, retry_logger

REPEAT_EVERY_S = 30.0
"""How often the unhealthy-server line repeats while the problem lasts."""
MIN_FAILURES_IN_A_ROW = 3
"""Failed samples in a row that stop a run at the least (a run of one episode at a time is not stopped
by one failure)."""
REASON_CHARS = 200
"""A failure reason is the first line of the error, at most this long (details: the log file)."""

logger = logging.getLogger(__name__)


def failed(record: dict[str, Any]) -> bool:
    """Whether a ``samples.jsonl`` record is an infrastructure failure (``--resume`` runs it again)."""
    return record.get("status") == "failed" or bool(record.get("remove_sample"))


def rejected(reason: str) -> bool:
    """Whether a failure reason is the server refusing the request itself (HTTP 4xx but 408/429): a bad
    request, which fails again however healthy the server is."""
    match = re.search(r"\bHTTP (4\d\d)\b", reason)
    return match is not None and match.group(1) not in ("408", "429")


def failure_reason(record: dict[str, Any]) -> str:
    """The first line of a failed record's ``infra_error``, shortened; one reason groups many samples."""
    reason = str(EpisodeMetadata.from_metadata(record.get("metadata")).infra_error or "").strip()
    return _first_line(reason) if reason else "no reason recorded"


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "…"


def duration(seconds: float) -> str:
    """``35 s``, ``2 min 5 s``, ``1 h 3 min``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


class RunMonitor:
    """The progress bar, the failure tally, the server's health as the retries tell it, and the reason
    to stop early (``stop_reason``). Everything runs on the rollout's event loop."""

    def __init__(
        self,
        *,
        total: int,
        done: int,
        todo: int,
        concurrency: int,
        unhealthy_timeout_s: float,
        server: str,
        quiet: bool,
    ) -> None:
        from tqdm.auto import tqdm

        self.todo = todo
        self.window = max(MIN_FAILURES_IN_A_ROW, min(concurrency, todo))
        self.unhealthy_timeout_s = unhealthy_timeout_s
        self.server = server
        self.quiet = quiet
        self.finished = 0
        self.failed = 0
        self.reasons: Counter[str] = Counter()
        self.failures_in_a_row = 0
        self.retrying: dict[int, RetryEvent] = {}
        self.unhealthy_since: float | None = None
        self.unhealthy_since_wall: float | None = None
        self.last_success: float | None = None
        self.last_error = ""
        self._last_said = 0.0
        self.stop_reason: str | None = None
        self.stopped_by_rejections = False
        """The early stop came from requests the server rejects (a bad request, not a sick server)."""
        self.progress = tqdm(total=total, initial=done, desc="rollout", unit="sample", disable=quiet)

    # ------------------------------------------------------------------ events

    def sample_finished(self, record: dict[str, Any]) -> None:
        """Count a sample written to ``samples.jsonl``; enough failures in a row set ``stop_reason``."""
        self.finished += 1
        if failed(record):
            reason = failure_reason(record)
            self.failed += 1
            self.reasons[reason] += 1
            self.failures_in_a_row += 1
            if self.failures_in_a_row >= self.window and self.finished < self.todo and not self.stop_reason:
                self.stop_reason = f"the last {self.failures_in_a_row} samples all failed (latest: {reason})"
                self.stopped_by_rejections = rejected(reason)
        else:
            self.failures_in_a_row = 0
            self._succeeded()
        self.progress.update(1)
        self._show_postfix()

    def retry_event(self, event: RetryEvent) -> None:
        """Follow one request's retries: the first one marks the server unhealthy (and says so)."""
        if event.outcome == "retrying":
            self.retrying[event.request] = event
            self.last_error = _first_line(event.error)
            if self.unhealthy_since is None:
                self.unhealthy_since = time.monotonic()
                self.unhealthy_since_wall = time.time()
                self._say_unhealthy()
        else:
            self.retrying.pop(event.request, None)
            if event.outcome == "recovered":
                self._succeeded()
        self._show_postfix()

    def tick(self) -> None:
        """Once a second: repeat the unhealthy line now and then, and stop a run whose server has
        failed every request for ``unhealthy_timeout_s``."""
        if self.unhealthy_since is None:
            return
        now = time.monotonic()
        failing_for = now - max(self.unhealthy_since, self.last_success or 0.0)
        if self.unhealthy_timeout_s and failing_for >= self.unhealthy_timeout_s and not self.stop_reason:
            self.stop_reason = (
                f"the server {self.server} failed every request for {duration(failing_for)} "
                f"(--unhealthy-timeout {self.unhealthy_timeout_s:g}; latest: {self.last_error})"
            )
            return
        if now - self._last_said >= REPEAT_EVERY_S:
            self._say_unhealthy()
        self._show_postfix()

    # ------------------------------------------------------------------ output

    def say(self, line: str) -> None:
        """A line between the progress bar's updates (not with ``quiet``), and in the run's log."""
        logger.warning(line)
        if not self.quiet:
            self.progress.write(line, file=sys.stderr)

    def _say_unhealthy(self) -> None:
        assert self.unhealthy_since is not None and self.unhealthy_since_wall is not None
        self._last_said = time.monotonic()
        since = time.strftime("%H:%M:%S", time.localtime(self.unhealthy_since_wall))
        lasted = time.monotonic() - self.unhealthy_since
        how_long = f" ({duration(lasted)})" if lasted >= 1 else ""
        self.say(f"server unhealthy since {since}{how_long}: {self._retries()}: {self.last_error}")

    def _retries(self) -> str:
        if not self.retrying:
            return "no request retrying now"
        latest = max(self.retrying.values(), key=lambda event: event.attempt)
        count = len(self.retrying)
        return (
            f"{count} request{'s' if count != 1 else ''} retrying "
            f"(retry {latest.attempt} of {latest.max_attempts - 1})"
        )

    def _succeeded(self) -> None:
        """A retried request or a sample succeeded: the server recovered once no request is retrying
        (a reply to a request sent before the trouble began, while others retry, is no recovery, but
        it means the server has not failed every request)."""
        self.last_success = time.monotonic()
        if self.unhealthy_since is None or self.retrying:
            return
        lasted = time.monotonic() - self.unhealthy_since
        self.unhealthy_since = self.unhealthy_since_wall = None
        self.say(f"server recovered after {duration(lasted)}")

    def _show_postfix(self) -> None:
        if self.quiet:
            return
        parts = [f"failed={self.failed}"] if self.failed else []
        if self.unhealthy_since is not None:
            lasted = duration(time.monotonic() - self.unhealthy_since)
            parts.append(f"server unhealthy {lasted}, {self._retries()}")
        self.progress.set_postfix_str(", ".join(parts), refresh=False)

    def close(self) -> None:
        """End the progress bar."""
        self.progress.close()


class _RetryEvents(logging.Handler):
    """Hands the client's retry events to the monitor."""

    def __init__(self, monitor: RunMonitor) -> None:
        super().__init__(logging.DEBUG)
        self.monitor = monitor

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "retry_event", None)
        if isinstance(event, RetryEvent):
            self.monitor.retry_event(event)


@contextlib.contextmanager
def run_logging(log_path: Path, monitor: RunMonitor) -> Iterator[None]:
    """While the run goes: every warning (Python ``warnings`` too, and those of executor workers
    started meanwhile) to ``log_path`` and not to stderr, and the client's retry events to
    ``monitor``. What was set before is restored after."""
    from strands_slime.rollout.executor_worker import WORKER_LOG_ENV

    root = logging.getLogger()
    file_handler = logging.FileHandler(log_path, encoding="utf-8", delay=True)
    file_handler.setLevel(logging.WARNING)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    events = _RetryEvents(monitor)
    saved = (retry_logger.level, retry_logger.propagate, os.environ.get(WORKER_LOG_ENV))
    os.environ[WORKER_LOG_ENV] = str(log_path)
    root.addHandler(file_handler)  # with a handler in place, logging's last resort (stderr) stays silent
    retry_logger.setLevel(logging.DEBUG)
    retry_logger.propagate = False  # a line per retry would drown the log: the monitor sums them up
    retry_logger.addHandler(events)
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        retry_logger.removeHandler(events)
        root.removeHandler(file_handler)
        file_handler.close()
        retry_logger.setLevel(saved[0])
        retry_logger.propagate = saved[1]
        if saved[2] is None:
            os.environ.pop(WORKER_LOG_ENV, None)
        else:
            os.environ[WORKER_LOG_ENV] = saved[2]
