"""The launch supervisor against a simulated Ray: each failure mode, the action taken and state.json.

The supervisor runs its real code path (``ray`` subprocesses for submit, status, stop, logs and the
node list) against ``tests/simulated_ray.py``'s stand-in CLI, whose jobs move on as Ray's do: the
exit code of the submit client says nothing, only ``ray job status`` does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from simulated_ray import install_simulated_ray

from strands_slime.launch.supervisor import RayCli, Settings, Supervisor, parse_job_status

pytestmark = pytest.mark.integration

NUM_ROLLOUT = 10
FINAL = str(NUM_ROLLOUT - 1)


@pytest.fixture
def sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    install_simulated_ray(bin_dir)
    (tmp_path / "ray_state").mkdir()
    (tmp_path / "save").mkdir()
    (tmp_path / "node0").mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_RAY_LOG", str(tmp_path / "ray_calls.jsonl"))
    monkeypatch.setenv("FAKE_RAY_STATE", str(tmp_path / "ray_state"))
    monkeypatch.setenv("FAKE_RAY_UP", "1")
    for name in ("FAKE_RAY_SCENARIO", "FAKE_RAY_JOB_STATUS", "FAKE_RAY_SUBMIT_ERROR", "FAKE_RAY_JOB_LOG"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **scenario: object) -> None:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps({"nodes": [[1, 8]], **scenario}))
    monkeypatch.setenv("FAKE_RAY_SCENARIO", str(path))


def _settings(tmp_path: Path, **overrides: object) -> Settings:
    settings = Settings(
        state_file=tmp_path / "node0" / "state.json",
        node_dir=tmp_path / "node0",
        checkpoint_dir=tmp_path / "save",
        save_dir=tmp_path / "save",
        entrypoint=[
            "python3",
            "train.py",
            "--save",
            str(tmp_path / "save"),
            "--num-rollout",
            str(NUM_ROLLOUT),
        ],
        job_steps=NUM_ROLLOUT,
        save_interval=5,
        nodes=1,
        gpus=8,
        restart_backoff=0,
        restart_backoff_max=0,
        watchdog_seconds=60,
        poll_interval=0.01,
        status_timeout=5,
        node_wait_timeout=5,
        checkpoint_gb=0,
    )
    for key, value in overrides.items():
        setattr(settings, key, value)
    return settings


def _run(tmp_path: Path, **overrides: object) -> tuple[int, dict, list[str]]:
    lines: list[str] = []
    supervisor = Supervisor(
        _settings(tmp_path, **overrides), RayCli("http://127.0.0.1:8265", 10), log=lines.append
    )
    status = supervisor.run()
    return status, json.loads((tmp_path / "node0" / "state.json").read_text()), lines


def _calls(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "ray_calls.jsonl").read_text().splitlines()]


def _verbs(tmp_path: Path, *verb: str) -> list[dict]:
    return [c for c in _calls(tmp_path) if c.get("args", [])[: len(verb)] == list(verb)]


def _stops(tmp_path: Path) -> list[str]:
    return [c["job_id"] for c in _calls(tmp_path) if c.get("event") == "job-stopped"]


def _actions(state: dict) -> list[str]:
    return [action["action"] for action in state["actions"]]


RUNNING = {"state": "RUNNING"}


def test_a_job_is_finished_only_when_ray_says_succeeded_and_the_last_step_is_saved(
    sim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scenario(sim, monkeypatch, attempts=[[{"state": "RUNNING", "step": 0}, {"state": "SUCCEEDED"}]])
    status, state, _ = _run(sim)
    assert status == 0
    assert (state["status"], state["attempt"], state["job_status"]) == ("finished", 1, "SUCCEEDED")
    assert state["latest_checkpoint"] == state["final_checkpoint"] == FINAL
    submit = _verbs(sim, "job", "submit")[0]
    assert "--no-wait" in submit["args"], "the submit client does not wait on the job"
    assert (sim / "node0" / f"job-{state['job_id']}.log").read_text().startswith("strands_slime step 0")


def test_succeeded_without_the_last_checkpoint_is_not_finished(
    sim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # slime saves the last step always: a SUCCEEDED job without it did not train to the end.
    _scenario(sim, monkeypatch, attempts=[[RUNNING, {"state": "SUCCEEDED"}]])
    entrypoint = ["python3", "train.py"]  # no --save: the simulated job writes no checkpoint
    status, state, _ = _run(sim, entrypoint=entrypoint, max_restarts_without_progress=0)
    assert status == 1 and state["status"] == "failed"
    assert "the last step's checkpoint (9) is not on disk" in state["stop_reason"]


def test_a_job_stopped_outside_the_launcher_is_recorded_as_stopped_not_finished(
    sim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scenario(
        sim, monkeypatch, attempts=[[RUNNING, RUNNING, {"state": "STOPPED", "message": "stopped by user"}]]
    )
    status, state, _ = _run(sim)
    assert status == 1
    assert state["status"] == "stopped" and state["job_status"] == "STOPPED"
    assert state["stop_reason"].startswith("the job was stopped outside this launcher")
    assert len(_verbs(sim, "job", "submit")) == 1, "not resubmitted"


def test_a_log_stream_closed_while_the_job_runs_neither_ends_nor_restarts_the_job(
    sim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timeline = [
        {"state": "RUNNING", "step": 0},
        {"state": "RUNNING", "close_log": True},
        {"state": "RUNNING", "step": 1},
        RUNNING,
        RUNNING,
        {"state": "SUCCEEDED"},
    ]
    _scenario(sim, monkeypatch, attempts=[timeline])
    status, state, _ = _run(sim)
    assert status == 0 and state["status"] == "finished"
    assert len(_verbs(sim, "job", "submit")) == 1 and _stops(sim) == []
    assert "restart-log-follower" in _actions(state)
    assert len(_verbs(sim, "job", "logs")) >= 3, "a new follower, then the whole log saved at the end"


def test_a_client_side_submit_error_adopts_the_job_ray_took(
    sim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_RAY_SUBMIT_ERROR", "created")
    _scenario(sim, monkeypatch, attempts=[[RUNNING, {"state": "SUCCEEDED"}]])
    status, state, _ = _run(sim)
    assert status == 0 and state["status"] == "finished"
    assert len(_verbs(sim, "job", "submit")) == 1, "no second job next to the one Ray holds"
    assert _actions(state)[0] == "submit-client-error"


@pytest.mark.slow  # several attempts, each a handful of `ray` processes
def test_a_submission_ray_never_got_is_submitted_again_with_no_job_left_running(
    sim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_RAY_SUBMIT_ERROR", "lost")
    _scenario(sim, monkeypatch, attempts=[[RUNNING, {"state": "SUCCEEDED"}]])
    status, state, _ = _run(sim)
    assert status == 0 and state["status"] == "finished" and state["attempt"] == 2, state
    submits = _verbs(sim, "job", "submit")
    assert len(submits) == 2 and all(s["running_jobs"] == [] for s in submits)
    assert "Ray has no job" in state["actions"][1]["why"]


@pytest.mark.slow  # several attempts, each a handful of `ray` processes
def test_a_failed_job_is_stopped_confirmed_and_resubmitted_alone(
    sim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scenario(
        sim,
        monkeypatch,
        attempts=[
            [{"state": "RUNNING", "checkpoint": 4}, {"state": "FAILED", "message": "NCCL timeout"}],
            [RUNNING, {"state": "SUCCEEDED"}],
        ],
    )
    status, state, lines = _run(sim)
    assert status == 0 and state["attempt"] == 2 and state["restarts"] == 1
    assert all(s["running_jobs"] == [] for s in _verbs(sim, "job", "submit"))
    assert any("resuming from checkpoint 4" in line for line in lines)
    assert "the job failed (NCCL timeout)" in next(
        a["why"] for a in state["actions"] if a["action"] == "job-ended"
    )


@pytest.mark.slow  # several attempts, each a handful of `ray` processes
def test_a_lost_node_is_waited_for_with_a_deadline_before_a_resubmit(
    sim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scenario(
        sim,
        monkeypatch,
        attempts=[[RUNNING, {"state": "FAILED", "message": "node died"}], [RUNNING, {"state": "SUCCEEDED"}]],
        nodes=[[2, 16], [1, 8], [1, 8], [2, 16]],  # all there, then one node lost after the crash
    )
    states: list[dict] = []
    supervisor = Supervisor(_settings(sim, nodes=2, gpus=16), RayCli("http://x", 10), log=lambda _: None)
    original = supervisor.write_state

    def recording(status: str | None = None) -> None:
        original(status)
        states.append(json.loads((sim / "node0" / "state.json").read_text()))

    supervisor.write_state = recording  # type: ignore[method-assign]
    assert supervisor.run() == 0
    waiting = [s for s in states if s["status"] == "waiting-for-nodes"]
    assert waiting and waiting[0]["waiting_for"]["what"] == "2 node(s) with 16 GPUs"
    assert waiting[0]["waiting_for"]["seen"] == "1 nodes, 8 GPUs alive" and waiting[0]["waiting_for"]["since"]
    assert states[-1]["status"] == "finished" and states[-1]["waiting_for"] is None
    assert len(_verbs(sim, "job", "submit")) == 2


def test_a_node_that_never_comes_back_ends_the_run_at_the_deadline(
    sim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scenario(sim, monkeypatch, attempts=[[RUNNING, {"state": "FAILED"}]], nodes=[[2, 16], [1, 8]])
    status, state, _ = _run(sim, nodes=2, gpus=16, node_wait_timeout=0.2)
    assert status == 1 and state["status"] == "failed"
    assert state["stop_reason"].startswith(
        "gave up: waited 0.2s for 2 node(s) with 16 GPUs; 1 nodes, 8 GPUs alive"
    )
    assert state["waiting_for"]["what"] == "2 node(s) with 16 GPUs"
    assert len(_verbs(sim, "job", "submit")) == 1


def test_the_watchdog_stops_a_hung_job_and_says_why(sim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # RUNNING forever after one step: no new step, perf line or checkpoint.
    _scenario(sim, monkeypatch, attempts=[[{"state": "RUNNING", "step": 0}]])
    status, state, _ = _run(sim, watchdog_seconds=0.3, max_restarts_without_progress=0)
    assert status == 1 and state["status"] == "failed"
    (stopped,) = _stops(sim)
    assert stopped == state["job_id"] and state["job_status"] == "STOPPED"
    watchdog = next(a for a in state["actions"] if a["action"] == "stop-job")
    assert watchdog["why"].startswith("no progress for 0.3s") and "last step 0" in watchdog["why"]
    assert state["last_step"] == 0


def test_a_full_disk_ends_the_run_instead_of_a_resubmit_that_cannot_save(
    sim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scenario(
        sim, monkeypatch, attempts=[[RUNNING, {"state": "FAILED", "message": "No space left on device"}]]
    )
    # A checkpoint larger than any disk: SAVE_DIR cannot hold one more.
    status, state, _ = _run(sim, checkpoint_gb=10**9)
    assert status == 1 and state["status"] == "failed"
    assert (
        state["stop_reason"].startswith("gave up: SAVE_DIR has")
        and "No space left on device" in state["stop_reason"]
    )
    assert "the next save will fail" in state["disk_warning"]
    assert len(_verbs(sim, "job", "submit")) == 1


@pytest.mark.slow  # several attempts, each a handful of `ray` processes
def test_the_restart_budget_counts_within_its_window(sim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = [{"state": "RUNNING"}, {"state": "FAILED"}]
    _scenario(sim, monkeypatch, attempts=[failing, failing, failing, [RUNNING, {"state": "SUCCEEDED"}]])
    monkeypatch.setenv("FAKE_RAY_CHECKPOINT_DIR", str(sim / "save"))
    # A zero-hour window forgets every restart at once: three crashes pass a budget of one.
    status, state, _ = _run(sim, max_restarts=1, restart_window_hours=0, max_restarts_without_progress=5)
    assert status == 0 and state["restarts"] == 3 and state["restarts_in_window"] == 1
    (sim / "ray_calls.jsonl").unlink()
    for job in (sim / "ray_state" / "jobs").glob("*.json"):
        job.unlink()
    (sim / "ray_state" / "submits").unlink()
    status, state, _ = _run(sim, max_restarts=1, restart_window_hours=24, max_restarts_without_progress=5)
    assert status == 1 and state["stop_reason"].startswith("gave up: 1 restarts within 24 h (MAX_RESTARTS=1)")


def test_a_signal_stops_the_job_and_records_it(sim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _scenario(sim, monkeypatch, attempts=[[{"state": "RUNNING", "step": 0}]])
    settings = _settings(sim)
    command = [
        sys.executable,
        "-m",
        "strands_slime.launch.supervisor",
        "run",
        "--state-file",
        str(settings.state_file),
        "--node-dir",
        str(settings.node_dir),
        "--checkpoint-dir",
        str(settings.checkpoint_dir),
        "--save-dir",
        str(settings.save_dir),
        "--address",
        "http://127.0.0.1:8265",
        "--job-steps",
        str(NUM_ROLLOUT),
        "--save-interval",
        "5",
        "--poll-interval",
        "0.02",
        "--checkpoint-gb",
        "0",
        "--",
        *settings.entrypoint,
    ]
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (
                settings.state_file.exists()
                and json.loads(settings.state_file.read_text()).get("last_step") == 0
            ):
                break
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 143, stderr
    state = json.loads(settings.state_file.read_text())
    assert state["status"] == "stopped" and state["stop_reason"].startswith(
        "the launcher stopped by signal 15"
    )
    assert _stops(sim) == [state["job_id"]]


@pytest.mark.parametrize(
    ("output", "returncode", "expected"),
    [
        ("-----\nJob 'j' succeeded\n-----\n", 0, "SUCCEEDED"),
        ("Job 'j' was stopped\n", 0, "STOPPED"),
        ("Job 'j' failed\nStatus message: exit code 3\n", 0, "FAILED"),
        ("Status for job 'j': RUNNING\nStatus message: Job is currently running.\n", 0, "RUNNING"),
        ("\x1b[32mStatus for job 'j': PENDING\x1b[0m\n", 0, "PENDING"),
        ("Job 'other' succeeded\n", 0, "UNKNOWN"),
        ("RuntimeError: Job j does not exist.\n", 1, "MISSING"),
        ("ConnectionError: refused\n", 1, "UNKNOWN"),
        ("", 0, "UNKNOWN"),
    ],
)
def test_ray_job_status_output_is_read_for_this_job_only(output: str, returncode: int, expected: str) -> None:
    assert parse_job_status("j", returncode, output).state == expected


def test_with_save_interval_one_the_first_checkpoint_megatron_keeps_is_removed(
    sim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (sim / "save" / "iter_0000000").mkdir()
    _scenario(
        sim,
        monkeypatch,
        attempts=[
            [
                {"state": "RUNNING", "checkpoint": 0},
                {"state": "RUNNING", "checkpoint": 1},
                {"state": "SUCCEEDED"},
            ]
        ],
    )
    status, state, _ = _run(sim, save_interval=1, remove_first_checkpoint=True)
    assert status == 0 and not (sim / "save" / "iter_0000000").exists()
    assert "remove-first-checkpoint" in _actions(state)


@pytest.mark.slow  # several attempts, each a handful of `ray` processes
def test_a_crash_loop_that_makes_no_progress_is_stopped(sim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every attempt fails before its first checkpoint: restarts left in the budget do not matter
    _scenario(sim, monkeypatch, attempts=[[RUNNING, {"state": "FAILED", "message": "exit code 7"}]])
    status, state, lines = _run(sim, max_restarts=10, max_restarts_without_progress=2)
    assert status == 1 and state["status"] == "failed"
    assert len(_verbs(sim, "job", "submit")) == 3, "the third failure in a row without progress stops"
    assert state["stop_reason"].startswith(
        "gave up: 3 failures in a row without a new checkpoint (latest: none)"
    )
    assert any(state["stop_reason"] in line for line in lines)


def test_a_pilot_is_never_restarted(sim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _scenario(sim, monkeypatch, attempts=[[RUNNING, {"state": "FAILED"}], [RUNNING, {"state": "SUCCEEDED"}]])
    status, state, _ = _run(sim, pilot=True, max_restarts_without_progress=5)
    assert status == 1 and len(_verbs(sim, "job", "submit")) == 1
    assert "a pilot is not restarted" in state["stop_reason"]


@pytest.mark.slow  # several attempts, each a handful of `ray` processes
def test_the_pause_before_a_restart_grows_only_while_restarts_bring_no_checkpoint(
    sim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(checkpoint: int | None) -> list[dict]:
        saved = {"state": "RUNNING"} if checkpoint is None else {"state": "RUNNING", "checkpoint": checkpoint}
        return [saved, {"state": "FAILED"}]

    def pauses_of(attempts: list[list[dict]], backoff_max: float) -> tuple[list[float], list[str], dict]:
        for job in (sim / "ray_state" / "jobs").glob("*.json"):
            job.unlink()
        (sim / "ray_state" / "submits").unlink(missing_ok=True)
        _scenario(sim, monkeypatch, attempts=[*attempts, [RUNNING, {"state": "SUCCEEDED"}]])
        pauses: list[float] = []
        lines: list[str] = []
        settings = _settings(
            sim, restart_backoff=1, restart_backoff_max=backoff_max, max_restarts_without_progress=5
        )
        supervisor = Supervisor(settings, RayCli("http://x", 10), log=lines.append, sleep=pauses.append)
        assert supervisor.run() == 0, lines
        return [pause for pause in pauses if pause >= 1], lines, json.loads(settings.state_file.read_text())

    pauses, lines, state = pauses_of([failing(1), failing(2), failing(3)], 2)
    assert pauses == [1, 1, 1], "every restart brought a new checkpoint: the pause stays RESTART_BACKOFF"
    assert "restart 2/5 (in 24 h) in 1s, resuming from checkpoint 2" in lines
    assert (state["status"], state["attempt"], state["restarts"]) == ("finished", 4, 3)
    assert state["stop_reason"] == "the job finished after 4 attempt(s)"
    pauses, _, _ = pauses_of([failing(None), failing(None), failing(None)], 3)
    assert pauses == [2, 3, 3], "no new checkpoint: doubling, up to RESTART_BACKOFF_MAX"
