"""The training launch's supervisor: the job's real state from Ray, a progress watchdog, restarts with a budget.

``python3 -m strands_slime.launch.supervisor run --state-file STATE --node-dir DIR ... -- python3 train.py ...``
submits with ``ray job submit --no-wait`` and from then on believes only ``ray job status``: the submit
client's exit code says nothing about the job. Everything it decides goes to ``state.json`` (one owner:
this module) and its log. Rules (finished, watchdog, resubmit, restart budget): docs/training.md, §5.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strands_slime.rollout.metrics import STEP_RECORD_PREFIX

__all__ = [
    "JobStatus",
    "Progress",
    "RayCli",
    "Settings",
    "Supervisor",
    "main",
    "parse_job_status",
]

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
"""Ray's terminal job states; PENDING and RUNNING are not."""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STATUS_PATTERNS = (
    (re.compile(r"Job '([^']+)' succeeded"), "SUCCEEDED"),
    (re.compile(r"Job '([^']+)' was stopped"), "STOPPED"),
    (re.compile(r"Job '([^']+)' failed"), "FAILED"),
)
_STATUS_FOR = re.compile(r"Status for job '([^']+)': ([A-Z]+)")
_STATUS_MESSAGE = re.compile(r"Status message: (.*)")
_NOT_FOUND = re.compile(r"does not exist|not found|No job", re.IGNORECASE)
_STEP_LINE = re.compile(re.escape(STEP_RECORD_PREFIX) + r" (\d+): ")
_PERF_LINE = re.compile(r"\bperf (\d+): \{")


@dataclass(frozen=True)
class JobStatus:
    """What ``ray job status`` said: Ray's state (``UNKNOWN`` when it could not tell, ``MISSING`` when
    Ray has no such job), its status message and, for UNKNOWN, why."""

    state: str
    message: str = ""

    @property
    def terminal(self) -> bool:
        """Whether Ray is done with the job (SUCCEEDED, FAILED or STOPPED)."""
        return self.state in TERMINAL


def parse_job_status(job_id: str, returncode: int, output: str) -> JobStatus:
    """Ray's job state from ``ray job status`` output; never guessed from the exit code alone."""
    text = _ANSI.sub("", output)
    message_match = _STATUS_MESSAGE.search(text)
    message = message_match.group(1).strip() if message_match else ""
    for pattern, state in _STATUS_PATTERNS:
        match = pattern.search(text)
        if match and match.group(1) == job_id:
            return JobStatus(state, message)
    match = _STATUS_FOR.search(text)
    if match and match.group(1) == job_id:
        return JobStatus(match.group(2), message)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit status {returncode}, no output"
    if returncode != 0 and _NOT_FOUND.search(text):
        return JobStatus("MISSING", last)
    return JobStatus("UNKNOWN", last)


class RayCli:
    """The ``ray`` command line, the way the supervisor uses it (Ray's own client handles auth)."""

    def __init__(self, address: str, timeout: float) -> None:
        self.address = address
        self.timeout = timeout

    def _run(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                ["ray", *args],
                capture_output=True,
                text=True,
                timeout=timeout or self.timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            return subprocess.CompletedProcess(error.cmd, 124, "", f"timed out after {error.timeout}s")
        except OSError as error:
            return subprocess.CompletedProcess(["ray", *args], 127, "", str(error))

    def submit(self, job_id: str, runtime_env: Path | None, entrypoint: Sequence[str]) -> tuple[int, str]:
        """``ray job submit --no-wait``: the client's exit status and output (not the job's fate)."""
        args = ["job", "submit", "--address", self.address, "--submission-id", job_id, "--no-wait"]
        if runtime_env is not None:
            args += ["--runtime-env", str(runtime_env)]
        result = self._run(*args, "--", *entrypoint)
        return result.returncode, (result.stdout + result.stderr).strip()

    def status(self, job_id: str) -> JobStatus:
        """Ray's state of the job, from ``ray job status``."""
        result = self._run("job", "status", "--address", self.address, job_id)
        return parse_job_status(job_id, result.returncode, result.stdout + result.stderr)

    def stop(self, job_id: str) -> None:
        """Ask Ray to stop the job (the caller reads the status back to confirm)."""
        self._run("job", "stop", "--address", self.address, job_id)

    def save_logs(self, job_id: str, path: Path) -> bool:
        """The job's whole log into ``path``; False when Ray could not give it."""
        result = self._run("job", "logs", "--address", self.address, job_id)
        if result.returncode != 0:
            return False
        path.write_text(result.stdout)
        return True

    def follow_logs(self, job_id: str, path: Path) -> subprocess.Popen[bytes]:
        """``ray job logs --follow`` into ``path`` (rewritten from the start: Ray replays the log)."""
        with path.open("wb") as out:
            return subprocess.Popen(
                ["ray", "job", "logs", "--address", self.address, "--follow", job_id],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def nodes(self) -> tuple[int, int] | None:
        """(alive nodes, their GPUs), or None when the cluster cannot be asked."""
        result = self._run("list", "nodes", "--address", self.address, "--detail", "--format", "json")
        if result.returncode != 0:
            return None
        try:
            nodes = json.loads(result.stdout)
        except json.JSONDecodeError:
            return None
        alive = [node for node in nodes if isinstance(node, dict) and node.get("state") == "ALIVE"]
        gpus = sum(int(float((node.get("resources_total") or {}).get("GPU", 0))) for node in alive)
        return len(alive), gpus

    def is_up(self, gcs_address: str) -> bool:
        """Whether ``ray status`` reaches the cluster's head."""
        return self._run("status", "--address", gcs_address).returncode == 0


@dataclass
class Progress:
    """The newest step record, slime ``perf`` line and checkpoint a job has shown: the watchdog's evidence."""

    step: int = -1
    perf: int = -1
    checkpoint: int | None = None
    _offset: int = 0
    _partial: bytes = b""

    def key(self) -> tuple[int, int, int]:
        """What changes when the job makes progress."""
        return (self.step, self.perf, -1 if self.checkpoint is None else self.checkpoint)

    def read_log(self, path: Path) -> None:
        """Read what the log gained since last time (from the start if a new follower rewrote it)."""
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        if size < self._offset:
            self._offset, self._partial = 0, b""
        with path.open("rb") as log:
            log.seek(self._offset)
            chunk = log.read()
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            if match := _STEP_LINE.search(line):
                self.step = max(self.step, int(match.group(1)))
            if match := _PERF_LINE.search(line):
                self.perf = max(self.perf, int(match.group(1)))


def latest_checkpoint(checkpoint_dir: Path) -> int | None:
    """The iteration Megatron last completed in ``checkpoint_dir`` (slime saves rollout_id), or None."""
    try:
        text = (checkpoint_dir / "latest_checkpointed_iteration.txt").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def free_gb(path: Path) -> int | None:
    """GB free on the filesystem that holds ``path`` (its nearest existing folder)."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        return shutil.disk_usage(existing).free // 1024**3
    except OSError:
        return None


@dataclass
class Settings:
    """One run's supervision: where its state and checkpoints are, its budgets and deadlines (seconds)."""

    state_file: Path
    node_dir: Path
    checkpoint_dir: Path
    save_dir: Path
    entrypoint: list[str]
    job_steps: int
    save_interval: int
    job_prefix: str = "strands-qwen3-8b"
    runtime_env: Path | None = None
    pilot: bool = False
    nodes: int = 1
    gpus: int = 8
    max_restarts: int = 5
    restart_window_hours: float = 24.0
    max_restarts_without_progress: int = 2
    restart_backoff: float = 60.0
    restart_backoff_max: float = 1800.0
    watchdog_seconds: float = 10800.0
    poll_interval: float = 5.0
    status_timeout: float = 300.0
    node_wait_timeout: float = 900.0
    checkpoint_gb: int = 115
    gcs_address: str = "127.0.0.1:6379"
    head_command: list[str] | None = None
    head_pid_file: Path | None = None
    head_log: Path | None = None
    remove_first_checkpoint: bool = False


class Stopped(Exception):
    """A signal asked the supervisor to stop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class _Outcome:
    kind: str  # finished | failed | stopped-outside | watchdog | lost
    reason: str


@dataclass
class Supervisor:
    """Submits the job, follows it through Ray's job API, and stops, restarts or records it."""

    settings: Settings
    ray: RayCli
    log: Callable[[str], None] = field(default=lambda text: print(text, file=sys.stderr, flush=True))
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        self.attempt = 0
        self.restarts = 0
        self.restart_times: list[float] = []
        self.job_id = ""
        self.job_state = ""
        self.status = "starting"
        self.stop_reason = ""
        self.waiting_for: dict[str, Any] | None = None
        self.actions: list[dict[str, Any]] = []
        self.progress = Progress()
        self.last_progress_wall = time.time()
        self.follower: subprocess.Popen[bytes] | None = None
        self.follower_restarts = 0
        self.disk_warning = ""

    # ------------------------------------------------------------------ state
    def write_state(self, status: str | None = None) -> None:
        """``state.json``, replaced atomically: the one record of what the run is doing and why."""
        if status is not None:
            self.status = status
        s = self.settings
        checkpoint = latest_checkpoint(s.checkpoint_dir)
        state = {
            "status": self.status,
            "stop_reason": self.stop_reason,
            "pilot": s.pilot,
            "attempt": self.attempt,
            "restarts": self.restarts,
            "restarts_in_window": len(self.restart_times),
            "max_restarts": s.max_restarts,
            "restart_window_hours": s.restart_window_hours,
            "job_id": self.job_id,
            "job_status": self.job_state or None,
            "last_step": self.progress.step if self.progress.step >= 0 else None,
            "last_progress": _iso(self.last_progress_wall),
            "latest_checkpoint": "none" if checkpoint is None else str(checkpoint),
            "final_checkpoint": str(s.job_steps - 1),
            "checkpoint_dir": str(s.checkpoint_dir),
            "save_interval": s.save_interval,
            "watchdog_seconds": s.watchdog_seconds,
            "waiting_for": self.waiting_for,
            "disk_warning": self.disk_warning or None,
            "actions": self.actions[-50:],
            "updated": _iso(time.time()),
        }
        tmp = s.state_file.with_name(s.state_file.name + ".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, s.state_file)

    def _action(self, action: str, why: str) -> None:
        self.actions.append({"time": _iso(time.time()), "action": action, "job_id": self.job_id, "why": why})
        self.log(f"{action}: {why}")

    # ------------------------------------------------------------------ the job
    def _job_log(self) -> Path:
        return self.settings.node_dir / f"job-{self.job_id}.log"

    def _submit(self) -> None:
        s = self.settings
        self.attempt += 1
        self.job_id = f"{s.job_prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{self.attempt}"
        self.job_state = ""
        self.write_state("running")
        self.log(f"submitting {self.job_id} (attempt {self.attempt})")
        returncode, output = self.ray.submit(self.job_id, s.runtime_env, s.entrypoint)
        if returncode != 0:
            # The client failed, not necessarily the submission: Ray may hold the job anyway.
            self._action("submit-client-error", f"ray job submit exited {returncode}: {_last_line(output)}")
        self.follower = None
        self.follower_restarts = 0

    def _start_follower(self) -> None:
        self.follower = self.ray.follow_logs(self.job_id, self._job_log())

    def _stop_follower(self) -> None:
        if self.follower is not None and self.follower.poll() is None:
            self.follower.terminate()
            try:
                self.follower.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.follower.kill()
                self.follower.wait()
        self.follower = None

    def _poll_status(self, deadline_from: float) -> JobStatus:
        """Ray's state of the job; an UNKNOWN answer is retried until ``status_timeout`` has passed."""
        while True:
            status = self.ray.status(self.job_id)
            if status.state != "UNKNOWN":
                return status
            if self.clock() - deadline_from >= self.settings.status_timeout:
                return status
            self.log(f"note: ray job status could not tell the state of {self.job_id}: {status.message}")
            self.sleep(self.settings.poll_interval)

    def stop_job(self, why: str) -> JobStatus:
        """``ray job stop``, then wait (bounded) until Ray reports the job terminal or gone."""
        self._action("stop-job", why)
        self.ray.stop(self.job_id)
        started = self.clock()
        while True:
            status = self.ray.status(self.job_id)
            if status.terminal or status.state == "MISSING":
                self.job_state = status.state
                return status
            if self.clock() - started >= self.settings.status_timeout:
                self._action("stop-job-unconfirmed", f"Ray still reports {status.state} for {self.job_id}")
                self.job_state = status.state
                return status
            self.sleep(self.settings.poll_interval)
            self.ray.stop(self.job_id)

    def _watch(self) -> _Outcome:
        """Follow one submitted job until it is over, stuck or lost."""
        s = self.settings
        last_answer = self.clock()
        last_key = None
        last_change = self.clock()
        seen_running = False
        while True:
            status = self.ray.status(self.job_id)
            now = self.clock()
            if status.state == "UNKNOWN":
                if now - last_answer >= s.status_timeout:
                    return _Outcome(
                        "lost",
                        f"Ray could not report the job's state for {s.status_timeout:g}s: {status.message}",
                    )
            elif status.state == "MISSING":
                if not seen_running:
                    return _Outcome("lost", f"Ray has no job {self.job_id}: the submission did not reach it")
                return _Outcome("lost", f"Ray no longer knows job {self.job_id}")
            else:
                last_answer = now
                if status.state != self.job_state:
                    self.job_state = status.state
                    self.write_state()
                seen_running = True
            if self.follower is None and seen_running:
                self._start_follower()
            elif self.follower is not None and self.follower.poll() is not None and not status.terminal:
                self.follower_restarts += 1
                self._action(
                    "restart-log-follower",
                    f"the log stream of {self.job_id} closed (exit {self.follower.returncode}) while Ray "
                    f"reports {status.state}; the job goes on",
                )
                self._start_follower()
            self.progress.read_log(self._job_log())
            self.progress.checkpoint = latest_checkpoint(s.checkpoint_dir)
            key = self.progress.key()
            if key != last_key:
                last_key, last_change = key, now
                self.last_progress_wall = time.time()
                self._remove_first_checkpoint()
                self.write_state()
            if status.terminal:
                return self._judge(status)
            self._check_disk()
            if s.watchdog_seconds > 0 and now - last_change >= s.watchdog_seconds:
                return _Outcome(
                    "watchdog",
                    f"no progress for {s.watchdog_seconds:g}s (no new step record, perf line or checkpoint; "
                    f"last step {self.progress.step}, checkpoint {self.progress.checkpoint})",
                )
            self.sleep(s.poll_interval)

    def _remove_first_checkpoint(self) -> None:
        """With ``--save-interval 1`` Megatron keeps iteration 0 for good (0 is a multiple of every
        retain interval): once a later checkpoint is complete, it goes."""
        first = self.settings.checkpoint_dir / "iter_0000000"
        checkpoint = self.progress.checkpoint
        if (
            self.settings.remove_first_checkpoint
            and checkpoint is not None
            and checkpoint > 0
            and first.is_dir()
        ):
            shutil.rmtree(first, ignore_errors=True)
            self._action(
                "remove-first-checkpoint",
                f"{first}: kept by Megatron's retain rule, superseded by {checkpoint}",
            )

    def _judge(self, status: JobStatus) -> _Outcome:
        final = self.settings.job_steps - 1
        checkpoint = latest_checkpoint(self.settings.checkpoint_dir)
        detail = f" ({status.message})" if status.message else ""
        if status.state == "SUCCEEDED":
            if checkpoint == final:
                return _Outcome("finished", f"the job finished after {self.attempt} attempt(s)")
            return _Outcome(
                "failed",
                f"Ray reports SUCCEEDED but the last step's checkpoint ({final}) is not on disk "
                f"(latest: {'none' if checkpoint is None else checkpoint})",
            )
        if status.state == "STOPPED":
            return _Outcome("stopped-outside", f"the job was stopped outside this launcher{detail}")
        return _Outcome("failed", f"the job failed{detail}")

    def _check_disk(self) -> None:
        free = free_gb(self.settings.save_dir)
        warning = ""
        if free is not None and free < self.settings.checkpoint_gb:
            warning = (
                f"SAVE_DIR has {free} GB free, less than one {self.settings.checkpoint_gb} GB checkpoint: "
                "the next save will fail"
            )
        if warning != self.disk_warning:
            self.disk_warning = warning
            if warning:
                self.log(f"warning: {warning}")
            self.write_state()

    # ------------------------------------------------------------------ between attempts
    def _wait_for_cluster(self) -> str:
        """Wait (bounded) until every expected node and GPU is in the cluster; '' or why not."""
        s = self.settings
        started, since = self.clock(), time.time()
        what = f"{s.nodes} node(s) with {s.gpus} GPUs"
        while True:
            if s.head_command is not None and not self.ray.is_up(s.gcs_address):
                self._restart_head()
            counts = self.ray.nodes()
            nodes, gpus = counts if counts is not None else (0, 0)
            if counts is not None and nodes >= s.nodes and gpus >= s.gpus:
                self.log(f"Ray cluster ready: {nodes} nodes, {gpus} GPUs")
                self.waiting_for = None
                return ""
            seen = "the cluster does not answer" if counts is None else f"{nodes} nodes, {gpus} GPUs alive"
            self.waiting_for = {
                "what": what,
                "since": _iso(since),
                "seen": seen,
                "deadline_s": s.node_wait_timeout,
            }
            self.write_state("waiting-for-nodes")
            self.log(f"waiting for {what} before submitting (since {_iso(since)}): {seen}")
            if self.clock() - started >= s.node_wait_timeout:
                return f"gave up: waited {s.node_wait_timeout:g}s for {what}; {seen}"
            self.sleep(s.poll_interval)

    def _restart_head(self) -> None:
        s = self.settings
        assert s.head_command is not None
        pid = _read_pid(s.head_pid_file)
        if pid is not None and _alive(pid):
            return
        self._action("restart-ray-head", "the Ray head this launch started is gone")
        log = (s.head_log or s.node_dir / "ray-node.log").open("ab")
        process = subprocess.Popen(
            s.head_command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        if s.head_pid_file is not None:
            s.head_pid_file.write_text(f"{process.pid}\n")

    def _room_for_a_checkpoint(self) -> str:
        free = free_gb(self.settings.save_dir)
        if free is not None and free < self.settings.checkpoint_gb:
            return f"gave up: SAVE_DIR has {free} GB free, less than one {self.settings.checkpoint_gb} GB checkpoint"
        return ""

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        """Supervise until the run is finished, stopped or given up; the launcher's exit status."""
        s = self.settings
        stalled = 0
        self.write_state("starting")
        reason = self._wait_for_cluster()
        if reason:
            self.stop_reason = (
                f"{reason}; is the launch running on every other node (NODE_RANK 1..{s.nodes - 1})?"
            )
            self.log(self.stop_reason)
            self.write_state("failed")
            return 1
        while True:
            before = latest_checkpoint(s.checkpoint_dir)
            self._submit()
            outcome = self._watch()
            self._stop_follower()
            if outcome.kind in ("watchdog", "lost"):
                self.stop_job(outcome.reason)
            self._save_log()
            if outcome.kind == "finished":
                self.stop_reason = outcome.reason
                self.write_state("finished")
                self.log(outcome.reason)
                return 0
            if outcome.kind == "stopped-outside":
                self.stop_reason = f"{outcome.reason}: not restarted"
                self.write_state("stopped")
                self.log(self.stop_reason)
                return 1
            self._action("job-ended", outcome.reason)
            if s.pilot:
                self.stop_reason = f"{outcome.reason}; a pilot is not restarted: its log is {self._job_log()}"
                self.write_state("failed")
                return 1
            now = self.clock()
            window = s.restart_window_hours * 3600
            self.restart_times = [t for t in self.restart_times if now - t < window]
            after = latest_checkpoint(s.checkpoint_dir)
            stalled = stalled + 1 if after == before else 0
            latest = "none" if after is None else str(after)
            reason = ""
            if len(self.restart_times) >= s.max_restarts:
                reason = (
                    f"gave up: {len(self.restart_times)} restarts within {s.restart_window_hours:g} h "
                    f"(MAX_RESTARTS={s.max_restarts}); last: {outcome.reason}"
                )
            elif stalled > s.max_restarts_without_progress:
                reason = (
                    f"gave up: {stalled} failures in a row without a new checkpoint (latest: {latest}), "
                    f"MAX_RESTARTS_WITHOUT_PROGRESS={s.max_restarts_without_progress}; last: {outcome.reason}"
                )
            else:
                reason = self._room_for_a_checkpoint()
                if reason:
                    reason = f"{reason}; last: {outcome.reason}"
            if reason:
                self.stop_reason = reason
                self.log(reason)
                self.write_state("failed")
                return 1
            delay = min(s.restart_backoff * 2 ** min(stalled, 20), s.restart_backoff_max)
            self.restarts += 1
            self.restart_times.append(now)
            self.log(
                f"restart {len(self.restart_times)}/{s.max_restarts} (in {s.restart_window_hours:g} h) "
                f"in {delay:g}s, resuming from checkpoint {latest}"
            )
            self.write_state("waiting-to-restart")
            self.sleep(delay)
            reason = self._wait_for_cluster()
            if reason:
                self.stop_reason = f"{reason}; the job before: {outcome.reason}"
                self.log(self.stop_reason)
                self.write_state("failed")
                return 1

    def _save_log(self) -> None:
        if not self.job_id:
            return
        if not self.ray.save_logs(self.job_id, self._job_log()):
            self.log(f"note: could not save the log of {self.job_id} with ray job logs")

    def stopped_by_signal(self, signum: int) -> int:
        """A signal: stop the job we own, record why, return the exit status."""
        self._stop_follower()
        if self.job_id and self.job_state not in TERMINAL:
            self.stop_job(f"the launcher got signal {signum}")
            self._save_log()
        self.stop_reason = f"the launcher stopped by signal {signum} (exit status {128 + signum})"
        self.write_state("stopped")
        return 128 + signum


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(seconds))


def _last_line(text: str) -> str:
    lines = [line for line in _ANSI.sub("", text).splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def _read_pid(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return bool(cmdline)


def mark_stopped(state_file: Path, reason: str) -> None:
    """Record a launcher that stopped before (or without) a supervisor: keeps a terminal state as it is."""
    state: dict[str, Any] = {}
    try:
        state = json.loads(state_file.read_text())
    except (OSError, json.JSONDecodeError):
        pass
    if state.get("status") in ("finished", "failed", "stopped"):
        return
    state.update(status="stopped", stop_reason=reason, updated=_iso(time.time()))
    tmp = state_file.with_name(state_file.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, state_file)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m strands_slime.launch.supervisor", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="submit the job and supervise it until it is over")
    run.add_argument("--state-file", type=Path, required=True)
    run.add_argument("--node-dir", type=Path, required=True)
    run.add_argument("--checkpoint-dir", type=Path, required=True)
    run.add_argument("--save-dir", type=Path, required=True)
    run.add_argument("--address", required=True, help="the dashboard's address for `ray job`")
    run.add_argument("--gcs-address", default="127.0.0.1:6379")
    run.add_argument("--job-steps", type=int, required=True)
    run.add_argument("--save-interval", type=int, required=True)
    run.add_argument("--job-prefix", default="strands-qwen3-8b")
    run.add_argument("--runtime-env", type=Path)
    run.add_argument("--pilot", action="store_true")
    run.add_argument("--nodes", type=int, default=1)
    run.add_argument("--gpus", type=int, default=8)
    run.add_argument("--max-restarts", type=int, default=5)
    run.add_argument("--restart-window-hours", type=float, default=24.0)
    run.add_argument("--max-restarts-without-progress", type=int, default=2)
    run.add_argument("--restart-backoff", type=float, default=60.0)
    run.add_argument("--restart-backoff-max", type=float, default=1800.0)
    run.add_argument("--watchdog-seconds", type=float, default=10800.0)
    run.add_argument("--poll-interval", type=float, default=5.0)
    run.add_argument("--status-timeout", type=float, default=300.0)
    run.add_argument("--node-wait-timeout", type=float, default=900.0)
    run.add_argument("--checkpoint-gb", type=int, default=115)
    run.add_argument(
        "--head-command", help="JSON list: the `ray start --head ... --block` to run if the head dies"
    )
    run.add_argument("--head-pid-file", type=Path)
    run.add_argument("--head-log", type=Path)
    run.add_argument(
        "--remove-first-checkpoint", action="store_true", help="remove iter_0000000 once a later one is saved"
    )
    run.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- then train.py's command line")
    stopped = sub.add_parser("mark-stopped", help="record a launcher that stopped without a supervisor")
    stopped.add_argument("--state-file", type=Path, required=True)
    stopped.add_argument("--reason", required=True)
    return parser


def _settings(options: argparse.Namespace) -> Settings:
    entrypoint = list(options.entrypoint)
    if entrypoint[:1] == ["--"]:
        entrypoint = entrypoint[1:]
    if not entrypoint:
        raise SystemExit("error: no job entrypoint after --")
    head_command = json.loads(options.head_command) if options.head_command else None
    return Settings(
        state_file=options.state_file,
        node_dir=options.node_dir,
        checkpoint_dir=options.checkpoint_dir,
        save_dir=options.save_dir,
        entrypoint=entrypoint,
        job_steps=options.job_steps,
        save_interval=options.save_interval,
        job_prefix=options.job_prefix,
        runtime_env=options.runtime_env,
        pilot=options.pilot,
        nodes=options.nodes,
        gpus=options.gpus,
        max_restarts=options.max_restarts,
        restart_window_hours=options.restart_window_hours,
        max_restarts_without_progress=options.max_restarts_without_progress,
        restart_backoff=options.restart_backoff,
        restart_backoff_max=options.restart_backoff_max,
        watchdog_seconds=options.watchdog_seconds,
        poll_interval=options.poll_interval,
        status_timeout=options.status_timeout,
        node_wait_timeout=options.node_wait_timeout,
        checkpoint_gb=options.checkpoint_gb,
        gcs_address=options.gcs_address,
        head_command=head_command,
        head_pid_file=options.head_pid_file,
        head_log=options.head_log,
        remove_first_checkpoint=options.remove_first_checkpoint,
    )


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    options = _parser().parse_args(argv)
    if options.command == "mark-stopped":
        mark_stopped(options.state_file, options.reason)
        return 0
    settings = _settings(options)
    prefix = "[supervisor] "
    supervisor = Supervisor(
        settings,
        RayCli(options.address, timeout=max(10.0, min(settings.status_timeout, 120.0))),
        log=lambda text: print(prefix + text, file=sys.stderr, flush=True),
    )

    def _raise(signum: int, _frame: object) -> None:
        raise Stopped(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _raise)
    try:
        return supervisor.run()
    except Stopped as stop:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        return supervisor.stopped_by_signal(stop.signum)


if __name__ == "__main__":
    sys.exit(main())
