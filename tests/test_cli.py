"""strands-slime rollout/demo: same code path as slime, written results and summary; failures shown
while they happen, nothing overwritten, one error line per usage error."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until_sync

from benchmarks.devserver_runners import DevServerThread
from benchmarks.fault_injection import clear_faults, inject_fault
from strands_slime.cli import RolloutError, RolloutOptions, main, run_rollout
from strands_slime.wandb_log import TABLE_COLUMNS

pytestmark = pytest.mark.integration

DATA_DIR = Path(__file__).resolve().parents[1] / "strands_slime" / "data"
DEMO = DATA_DIR / "demo_problems.jsonl"
SCRIPT = DATA_DIR / "demo_script.json"
FAST_RETRIES = "strands_slime:\n  client:\n    retry_delay_s: 0.05\n    max_retry_delay_s: 0.1\n"
NO_RETRIES = "strands_slime:\n  client:\n    max_retries: 0\n"


async def test_rollout_on_the_demo_problems(tmp_path: Path) -> None:
    summary = await run_rollout(RolloutOptions(data=DEMO, out=tmp_path, n_samples=2, quiet=True))
    evaluation = summary["evaluation"]
    # the demo script solves 4 of the 5 problems with the Python tool and gets the last one wrong
    assert evaluation["accuracy"] == pytest.approx(0.8) and evaluation["pass@2"] == pytest.approx(0.8)
    assert evaluation["num_prompts"] == 5 and evaluation["status/completed"] == 10
    agent = summary["agent"]
    assert agent["parse_errors/mean"] == pytest.approx(0.2) and agent["tool_iterations/max"] == 2
    assert summary["throughput"]["model_tokens"] > 0
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 10
    for record in records:
        assert len(record["loss_mask"]) == len(record["rollout_log_probs"]) == record["response_length"]
        assert record["status"] == "completed" and isinstance(record["reward"], float)
    solved = [r for r in records if r["label"] == "5050"]
    assert all("<tool_response>\n5050\n</tool_response>" in r["response"] for r in solved)
    assert all(r["reward"] == 1.0 for r in solved)
    wrong = [r for r in records if r["label"] == "1009"]
    assert all(r["reward"] == -1.0 for r in wrong)  # no shaping by default
    assert "| accuracy | 0.8000 |" in (tmp_path / "summary.md").read_text()


@pytest.mark.slow  # 18 s
def test_demo_command_end_to_end(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "strands_slime.cli",
            "demo",
            "--out",
            str(tmp_path),
            "--quiet",
            "--limit",
            "2",
            "--n-samples",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # --quiet: nothing at all (no progress bar, no summary, no warnings); the report is still written
    assert (result.stdout, result.stderr) == ("", "")
    assert json.loads((tmp_path / "summary.json").read_text())["samples"] == 2
    assert (tmp_path / "report.html").is_file()


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI in-process; it must exit 2 with exactly one ``error:`` line on stderr (argparse's
    usage errors included) and nothing on stdout."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert captured.out == ""
    return err


def test_data_config_and_tokenizer_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path / "run")]
    assert "does not exist" in _error_line(
        capsys, ["rollout", "--data", str(tmp_path / "missing.jsonl"), *out]
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x", "label": "1"}\n')
    assert "bad.jsonl:1: missing key 'prompt'" in _error_line(capsys, ["rollout", "--data", str(bad), *out])
    bad.write_text("not json\n")
    assert "not JSON" in _error_line(capsys, ["rollout", "--data", str(bad), *out])
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    assert "not a readable parquet file" in _error_line(capsys, ["rollout", "--data", str(broken), *out])
    assert "--limit must be >= 1" in _error_line(
        capsys, ["rollout", "--data", str(DEMO), "--limit", "0", *out]
    )
    config = tmp_path / "config.yaml"
    config.write_text("strands_slime:\n  max_tool_iters: -3\n  no_such_key: 1\n")
    message = _error_line(capsys, ["rollout", "--data", str(DEMO), "--config", str(config), *out])
    assert str(config) in message and "no_such_key" in message
    message = _error_line(
        capsys, ["rollout", "--data", str(DEMO), "--tokenizer", str(tmp_path / "nope"), *out]
    )
    assert f"the tokenizer directory {tmp_path / 'nope'} from --tokenizer does not exist" in message
    not_a_tokenizer = tmp_path / "empty"
    not_a_tokenizer.mkdir()
    message = _error_line(capsys, ["rollout", "--data", str(DEMO), "--tokenizer", str(not_a_tokenizer), *out])
    assert message == (
        f"error: the directory {not_a_tokenizer} from --tokenizer holds no tokenizer: none of "
        "tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json is in it"
    )
    (not_a_tokenizer / "tokenizer_config.json").write_text("{}")
    message = _error_line(capsys, ["rollout", "--data", str(DEMO), "--tokenizer", str(not_a_tokenizer), *out])
    assert f"cannot load the tokenizer '{not_a_tokenizer}' from --tokenizer: " in message
    assert "(3) an equivalent slow tokenizer class" in message, "transformers' whole message, on one line"
    with pytest.raises(Exception, match="not JSON"):  # --debug: the real exception and traceback
        main(["rollout", "--data", str(bad), "--debug", *out])
    assert not (tmp_path / "run").exists(), "a run that did not start leaves no --out folder"


@pytest.mark.unit
def test_dead_or_silent_base_url_fails_in_seconds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    refused = ["rollout", "--data", str(DEMO), "--base-url", "http://127.0.0.1:9", "--out", str(tmp_path)]
    assert "is unreachable" in _error_line(capsys, refused)
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        argv = [
            "rollout",
            "--data",
            str(DEMO),
            "--base-url",
            url,
            "--health-timeout",
            "1",
            "--out",
            str(tmp_path),
        ]
        assert "did not answer GET /health within 1 s" in _error_line(capsys, argv)
    assert time.monotonic() - started < 15


def test_parquet_data_and_the_servers_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [json.loads(line) for line in DEMO.read_text().splitlines()]
    data = tmp_path / "demo.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    with DevServerThread("scripted", script=SCRIPT) as server:  # reports the bundled tokenizer in /model_info
        code = main(
            [
                "rollout",
                "--data",
                str(data),
                "--base-url",
                server.url,
                "--limit",
                "2",
                "--out",
                str(tmp_path / "r"),
            ]
        )
    assert code == 0
    stdout = capsys.readouterr().out
    assert "samples: 2  prompts: 2" in stdout and "accuracy: 1.000" in stdout
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["tokenizer"].endswith("tokenizer_files")
    assert summary["sampling_params"]["no_stop_trim"] is True and summary["sampling_params"]["top_k"] == -1
    assert summary["config"]["max_tool_iters"] == 5 and summary["options"]["limit"] == 2
    assert summary["versions"]["strands-agents"] and summary["versions"]["python"]


def test_a_run_where_samples_fail_exits_nonzero_with_one_line_per_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(NO_RETRIES)
    with DevServerThread("scripted", script=SCRIPT) as server:
        inject_fault(server, status=500, count=1000, message="engine on fire")
        argv = ["rollout", "--data", str(DEMO), "--base-url", server.url, "--config", str(config)]
        code = main([*argv, "--out", str(tmp_path / "r")])
        captured = capsys.readouterr()
        assert code == 1
        assert "failed: 5 of 5 samples (100.0%), 1 reason:" in captured.out
        (reason_line,) = [line for line in captured.out.splitlines() if "engine on fire" in line]
        assert reason_line.lstrip().startswith("5  SGLangHTTPError: HTTP 500")
        assert f"details: {tmp_path / 'r' / 'rollout.log'}" in captured.out
        # every sample failed: accuracy 0, not the accuracy of the ones that finished
        assert (
            "accuracy: 0.000 (failed samples count as wrong; – over the 0 that did not fail)" in captured.out
        )
        (error,) = _lines_besides_the_progress_bar(captured.err)
        assert error.startswith("error: 100.0% of the samples failed (more than --max-failure-rate 0.1")
        assert error.endswith("--resume runs the failed samples again")
        assert main([*argv, "--max-failure-rate", "1", "--quiet", "--out", str(tmp_path / "q")]) == 0
        assert capsys.readouterr() == ("", "")  # --quiet: nothing at all
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["failures"]["failed"] == 5 and summary["failures"]["top_reasons"][0]["count"] == 5
    assert summary["evaluation"]["accuracy"] == 0.0 and summary["evaluation"]["status/failed"] == 5
    log = (tmp_path / "r" / "rollout.log").read_text()
    assert log.count("episode failed: SGLangHTTPError: HTTP 500") == 5, "the details are in the log"


def _lines_besides_the_progress_bar(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("rollout:")]


def test_an_unhealthy_server_is_shown_while_it_lasts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(FAST_RETRIES)
    out = tmp_path / "r"
    with DevServerThread("scripted", script=SCRIPT) as server:
        inject_fault(server, status=500, count=6, message="engine on fire")
        argv = ["rollout", "--data", str(DEMO), "--base-url", server.url, "--config", str(config)]
        assert main([*argv, "--limit", "2", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    unhealthy = re.search(
        r"server unhealthy since \d\d:\d\d:\d\d: \d requests? retrying \(retry 1 of 60\): "
        r"HTTP 500 from \S+/generate: .*engine on fire",
        err,
    )
    assert unhealthy, err
    assert re.search(r"server recovered after \d+ s", err[unhealthy.end() :]), err
    log = (out / "rollout.log").read_text()
    assert "server unhealthy since" in log and "server recovered after" in log
    assert json.loads((out / "summary.json").read_text())["failures"]["failed"] == 0


def test_a_server_that_fails_everything_stops_the_run_and_resume_runs_the_failed_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(NO_RETRIES)
    out = tmp_path / "r"
    samples = out / "samples.jsonl"
    with DevServerThread("scripted", script=SCRIPT) as server:
        inject_fault(server, status=500, count=10_000, message="engine on fire")
        argv = ["rollout", "--data", str(DEMO), "--base-url", server.url, "--config", str(config)]
        argv += ["--n-samples", "2", "--concurrency", "3", "--out", str(out)]
        assert main(argv) == 1
        err = capsys.readouterr().err
        failed = [json.loads(line) for line in samples.read_text().splitlines()]
        assert 3 <= len(failed) < 10 and {r["status"] for r in failed} == {"failed"}
        error = _lines_besides_the_progress_bar(err)[-1]
        assert error.startswith(
            "error: stopped early: the last 3 samples all failed (latest: SGLangHTTPError"
        )
        assert f"{len(failed)} of 10 samples are saved in {samples}" in error
        assert error.endswith(
            "once the server is healthy, --resume runs the rest and the failed samples again"
        )
        assert f"failed: {len(failed)} of {len(failed)} samples (100.0%), 1 reason:" in err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["stopped"].startswith("the last 3 samples all failed") and summary["samples"] == len(
            failed
        )
        assert (out / "report.html").is_file()

        clear_faults(server)
        assert main([*argv, "--resume", "--quiet"]) == 0
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert sorted((r["group_index"], r["sample_index"]) for r in records) == [
        (g, k) for g in range(5) for k in range(2)
    ]
    assert {r["status"] for r in records} == {"completed"}, "the failed samples ran again"
    earlier = [json.loads(line) for line in (out / "failed_attempts.jsonl").read_text().splitlines()]
    assert earlier == failed, "their failed attempts are kept, not overwritten"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"] == 10 and summary["failures"]["failed"] == 0 and summary["stopped"] is None


def test_a_server_failing_every_request_for_unhealthy_timeout_stops_the_run_and_leaves_no_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(FAST_RETRIES)
    out = tmp_path / "runs" / "r"
    with DevServerThread("scripted", script=SCRIPT) as server:
        inject_fault(server, status=503, count=100_000, message="warming up")
        argv = ["rollout", "--data", str(DEMO), "--base-url", server.url, "--config", str(config)]
        assert main([*argv, "--unhealthy-timeout", "1", "--out", str(out)]) == 1
    error = _lines_besides_the_progress_bar(capsys.readouterr().err)[-1]
    assert re.fullmatch(
        rf"error: stopped early: the server {re.escape(server.url)} failed every request for \d+ s "
        r"\(--unhealthy-timeout 1; latest: HTTP 503 .*warming up.*\); no sample finished, nothing was saved; "
        r"once the server is healthy, run it again",
        error,
    ), error
    assert not (tmp_path / "runs").exists(), "a run that saved nothing leaves no folder"


def test_results_are_never_overwritten_unasked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r"
    samples = out / "samples.jsonl"
    argv = ["rollout", "--data", str(DEMO), "--limit", "1", "--out", str(out)]
    assert main([*argv, "--quiet"]) == 0
    before = samples.read_bytes()
    message = _error_line(capsys, argv)
    assert message == (
        f"error: {out} already holds 1 sample of an earlier run: --resume continues it (and runs its failed "
        "samples again), --overwrite deletes them and starts over, or pick another --out"
    )
    assert samples.read_bytes() == before
    assert "not allowed with argument" in _error_line(capsys, [*argv, "--resume", "--overwrite"])
    (out / "notes.txt").write_text("mine")
    assert (
        main(["rollout", "--data", str(DEMO), "--limit", "2", "--out", str(out), "--overwrite", "--quiet"])
        == 0
    )
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(records) == 2 and json.loads(before)["session_id"] not in {r["session_id"] for r in records}
    assert (out / "notes.txt").read_text() == "mine", "--overwrite deletes the run's files only"


def test_a_bad_out_is_one_line_before_any_server_or_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    # a dead server and a missing tokenizer: --out is checked first, so neither is what is reported
    later = ["--base-url", "http://127.0.0.1:9", "--tokenizer", str(tmp_path / "no-tokenizer")]
    argv = ["rollout", "--data", str(DEMO), *later]
    cases = [
        (a_file, f"error: --out {a_file} is a file, not a directory"),
        (a_file / "sub", f"error: --out {a_file / 'sub'} cannot be created: {a_file} is a file"),
        (Path("/sys"), "error: --out /sys is not writable: cannot create files in it (Permission denied)"),
        (
            Path("/sys/strands-slime"),
            "error: --out /sys/strands-slime is not writable: cannot create files in /sys",
        ),
    ]
    for out, message in cases:
        started = time.monotonic()
        assert _error_line(capsys, [*argv, "--out", str(out)]).startswith(message)
        assert time.monotonic() - started < 2, "found before anything slow"


def test_failed_runs_leave_no_out_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs" / "r"
    assert "is unreachable" in _error_line(
        capsys, ["rollout", "--data", str(DEMO), "--base-url", "http://127.0.0.1:9", "--out", str(out)]
    )
    assert "does not exist" in _error_line(
        capsys, ["rollout", "--data", str(DEMO), "--tokenizer", str(tmp_path / "none"), "--out", str(out)]
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["rollout"],
        ["rollout", "--data", str(DEMO), "--n-samples", "x"],
        ["demo", "--print-paths", "nothing"],
        ["view", "/nonexistent/run"],
        ["drift", "--samples", "/nonexistent/samples.jsonl", "--tokenizer", "qwen3"],
        ["configs", "nope.yaml"],
        ["serve", "--port", "-1"],
        ["serve", "--backend", "scripted", "--script", "/nonexistent/script.json", "--port", "0"],
        ["data", "--dataset", "gsm8k"],
        ["no-such-command"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_every_command_reports_a_usage_error_as_one_line_and_status_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    _error_line(capsys, argv)


def test_demo_prints_where_its_files_are(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--print-paths"]) == 0
    listed = {line.split()[0]: Path(line.split()[1]) for line in capsys.readouterr().out.splitlines()}
    assert listed == {
        "problems": DEMO,
        "script": SCRIPT,
        "config": DATA_DIR.parent / "configs" / "strands_math.yaml",
        "eval-config": DATA_DIR.parent / "configs" / "eval_aime.yaml",
    }
    assert all(path.is_file() for path in listed.values())
    assert main(["demo", "--print-paths", "script"]) == 0
    assert capsys.readouterr().out == f"{SCRIPT}\n"


def test_wandb_is_checked_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an install without the extra looks like
    out = tmp_path / "r"
    argv = ["rollout", "--data", str(DEMO), "--base-url", "http://127.0.0.1:9", "--out", str(out), "--wandb"]
    assert _error_line(capsys, argv) == "error: --wandb needs wandb: pip install 'strands-slime[wandb]'"
    assert not out.exists()


class _LiveStderr:
    """A CLI subprocess whose stderr is read as it is written (the progress bar writes no newlines)."""

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        while chunk := os.read(self.process.stderr.fileno(), 65536):
            self.chunks.append(chunk)

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def finish(self, timeout: float) -> int:
        code = self.process.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return code


@pytest.mark.slow  # a subprocess that watches its server fail and recover: 8-15 s
def test_the_unhealthy_server_line_shows_while_the_run_waits_and_quiet_shows_nothing(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("strands_slime:\n  client:\n    retry_delay_s: 0.2\n    max_retry_delay_s: 0.5\n")
    with DevServerThread("scripted", script=SCRIPT) as server:
        inject_fault(server, status=503, count=100_000, message="warming up")
        argv = [sys.executable, "-m", "strands_slime.cli", "rollout", "--data", str(DEMO)]
        argv += ["--base-url", server.url, "--config", str(config)]
        run = _LiveStderr([*argv, "--limit", "2", "--out", str(tmp_path / "r")])
        try:
            wait_until_sync(
                lambda: "server unhealthy since" in run.text, timeout=120, what="the unhealthy line"
            )
            assert run.process.poll() is None, "shown while the run waits, not at its end"
            assert re.search(r"\d requests? retrying \(retry \d+ of 60\): HTTP 503 .*warming up", run.text)
            clear_faults(server)
            assert run.finish(timeout=120) == 0, run.text[-3000:]
        finally:
            run.process.kill()
        assert re.search(r"server recovered after \d+ s", run.text.split("server unhealthy since", 1)[1])
        assert "WARNING" not in run.text and "Traceback" not in run.text

        # --quiet with an episode that fails after a tool round (its first reply passes, the second is
        # a 500), which Strands reports too: nothing on the terminal, the details in the log
        inject_fault(server, delay_s=0.01, count=1)
        inject_fault(server, status=500, count=1, message="engine on fire")
        config.write_text(NO_RETRIES)
        quiet = subprocess.run(
            [*argv, "--limit", "1", "--out", str(tmp_path / "q"), "--quiet", "--max-failure-rate", "1"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    log = (tmp_path / "q" / "rollout.log").read_text()
    assert log.count("episode failed: SGLangHTTPError: HTTP 500") == 1 and "event loop cycle failed" in log


@pytest.mark.slow  # a worker process starts: 5-10 s
def test_quiet_stays_quiet_with_executor_workers_their_warnings_go_to_the_log(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(NO_RETRIES + "  executor:\n    workers: 1\n    oversubscribe: true\n")
    with DevServerThread("scripted", script=SCRIPT) as server:
        inject_fault(server, status=500, count=1, message="engine on fire")
        argv = [sys.executable, "-m", "strands_slime.cli", "rollout", "--data", str(DEMO), "--limit", "2"]
        argv += ["--base-url", server.url, "--config", str(config), "--out", str(tmp_path / "r")]
        done = subprocess.run(
            [*argv, "--quiet", "--max-failure-rate", "1"], capture_output=True, text=True, timeout=300
        )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    log = (tmp_path / "r" / "rollout.log").read_text()
    assert re.search(
        r"strands_slime executor worker \d+ WARNING .*episode failed: SGLangHTTPError: HTTP 500", log
    )


def _wait_for_lines(path: Path, count: int, deadline_s: float) -> None:
    wait_until_sync(
        lambda: path.exists() and len(path.read_text().splitlines()) >= count,
        timeout=deadline_s,
        what=f"{path} to reach {count} lines",
    )


@pytest.mark.slow  # 57 s
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_keeps_finished_samples_and_resume_runs_the_rest(
    tmp_path: Path, signum: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    samples = tmp_path / "samples.jsonl"
    with DevServerThread("scripted", script=SCRIPT, latency=0.3) as server:
        argv = [sys.executable, "-m", "strands_slime.cli", "rollout", "--data", str(DEMO), "--quiet"]
        argv += ["--base-url", server.url, "--n-samples", "4", "--concurrency", "2", "--out", str(tmp_path)]
        process = subprocess.Popen(
            [*argv, "--wandb"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            _wait_for_lines(samples, 2, deadline_s=120)
            process.send_signal(signum)
            stdout, stderr = process.communicate(timeout=60)
        finally:
            process.kill()
        assert process.returncode == 128 + signum, stderr
        kept = [json.loads(line) for line in samples.read_text().splitlines()]
        assert 2 <= len(kept) < 20
        assert stdout == "" and stderr.strip().splitlines() == [
            f"interrupted by {signal.Signals(signum).name}: {len(kept)} of 20 samples are saved in {samples}; "
            "--resume runs the rest"
        ]
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["interrupted"] == signal.Signals(signum).name and summary["samples"] == len(kept)
        assert len(_report_rows(tmp_path / "report.html")) == len(kept), "the report covers what finished"
        # the interrupted run is in W&B too, as a run that did not exit 0
        [run_file] = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
        exits = [
            r.exit.exit_code
            for r in _finished_wandb_records(run_file)
            if r.WhichOneof("record_type") == "exit"
        ]
        assert exits == [128 + signum]

        server.clear_request_log()
        scheduler = server.server.scheduler
        server.call(lambda: setattr(scheduler, "latency", 0.0))  # the latency only had to outlast the signal
        resumed = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    keys = [(r["group_index"], r["sample_index"]) for r in records]
    assert sorted(keys) == [(g, k) for g in range(5) for k in range(4)]  # each exactly once
    assert records[: len(kept)] == kept  # the finished samples were kept as they were
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["samples"] == 20 and summary["throughput"]["samples_this_run"] == 20 - len(kept)


def _report_rows(path: Path) -> list[dict[str, Any]]:
    match = re.search(
        r'<script type="application/json" id="report-data">(.*?)</script>', path.read_text(), re.S
    )
    assert match, "the report embeds its data"
    return json.loads(match.group(1))["rows"]


def test_resume_refuses_another_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "samples.jsonl").write_text(
        json.dumps({"group_index": 0, "sample_index": 0, "prompt": "another prompt"}) + "\n"
    )
    argv = ["rollout", "--data", str(DEMO), "--resume", "--out", str(tmp_path)]
    assert "holds other prompts than" in _error_line(capsys, argv)
    (tmp_path / "samples.jsonl").write_text('{"group_index": 0, "sampl\n{"group_index": 1}\n')
    error = _error_line(capsys, argv)
    assert "samples.jsonl:1: not JSON" in error and error.endswith("; cannot resume from it")
    (tmp_path / "samples.jsonl").write_text('{"tokens": [1]}\n')
    assert "samples.jsonl:1: not a strands-slime sample" in _error_line(capsys, argv)
    (tmp_path / "samples.jsonl").write_text('{"group_index": 0, "sample_index": 0, "metadata": [1]}\n')
    error = _error_line(capsys, argv)
    assert "samples.jsonl:1: sample.metadata must be a mapping, got list; cannot resume from it" in error


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["rollout", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 0.1)" in text and "(default: 32)" in text and "(default: 4096)" in text
    assert "(default: 300.0)" in text, "--unhealthy-timeout"
    assert "(default: None)" not in text and "(default: False)" not in text


def test_serve_delegates_to_the_dev_server_under_its_own_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: strands-slime serve ") and "--backend" in out


def _finished_wandb_records(run_file: Path) -> list[Any]:
    """The records of a finished W&B run: W&B's service process may still be writing the file when
    ``finish()`` returns, and it writes the ``exit`` record last."""
    return wait_until_sync(
        lambda: (
            (records := _wandb_records(run_file))
            and records[-1].WhichOneof("record_type") == "exit"
            and records
        ),
        timeout=60,
        what=f"the exit record in {run_file}",
    )


def _wandb_records(run_file: Path) -> list[Any]:
    """Records of a ``.wandb`` file: W&B's LevelDB-style log (7-byte header, 32 KiB blocks, chunks)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, position = [], b"", 7
    while position + 7 <= len(data):
        room = 32768 - position % 32768
        if room < 7:  # block trailer padding
            position += room
            continue
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


@pytest.mark.slow  # 7 s at load 7
def test_wandb_offline_logs_zeros_and_settings(  # and a table of the samples, and the report
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    argv = ["rollout", "--data", str(DEMO), "--limit", "2", "--temperature", "0.7", "--out", str(tmp_path)]
    assert main([*argv, "--quiet", "--wandb"]) == 0
    [run_file] = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = _finished_wandb_records(run_file)
    history: dict[str, Any] = {}
    config: dict[str, Any] = {}
    artifacts = []
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.update(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
        if kind == "run":  # the config travels with the run record ...
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        if kind == "config":  # ... and with later updates
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        if kind == "artifact":
            artifacts.append(record.artifact)
        if kind == "exit":
            assert record.exit.exit_code == 0
    assert history["evaluation/accuracy"] == 1.0
    for zero in (
        "agent/status/failed",
        "agent/status/aborted",
        "agent/parse_errors/per_call",
        "failures/rate",
    ):
        assert history[zero] == 0.0, zero
    assert config["sampling_params"]["temperature"] == 0.7
    assert config["versions"]["strands-slime"] and config["rollout_config"]["max_tool_iters"] == 5
    # one table row per sample, with what a person scans them by
    assert history["samples/_type"] == "table-file" and history["samples/nrows"] == 2
    [table_file] = tmp_path.glob("wandb/offline-run-*/files/media/table/samples_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == list(TABLE_COLUMNS)
    label = TABLE_COLUMNS.index("label")
    assert sorted(row[label] for row in table["data"]) == sorted(
        json.loads(line)["label"] for line in (tmp_path / "samples.jsonl").read_text().splitlines()
    )
    # the HTML report and the summary as an artifact
    [artifact] = [artifact for artifact in artifacts if artifact.type == "rollout-report"]
    assert {entry.path for entry in artifact.manifest.contents} == {
        "report.html",
        "summary.json",
        "summary.md",
    }


async def test_resume_drops_a_torn_last_line_counts_its_own_throughput_and_refuses_a_smaller_plan(
    tmp_path: Path,
) -> None:
    await run_rollout(RolloutOptions(data=DEMO, out=tmp_path, limit=2, quiet=True))
    samples = tmp_path / "samples.jsonl"
    first = samples.read_text().splitlines()
    with samples.open("a") as handle:
        handle.write('{"group_index": 1, "sample_index": 0, "tok')  # killed mid-write
    summary = await run_rollout(RolloutOptions(data=DEMO, out=tmp_path, limit=3, resume=True, quiet=True))
    lines = samples.read_text().splitlines()
    assert lines[:2] == first and len(lines) == 3
    assert sorted(json.loads(line)["group_index"] for line in lines) == [0, 1, 2]
    throughput = summary["throughput"]
    assert summary["samples"] == 3 and throughput["samples_this_run"] == 1
    # this run's one sample over this run's time (it was all 3 samples: 20,659 samples/s); the wall
    # seconds are rounded to 1 ms, hence the tolerance
    assert throughput["samples_per_second"] == pytest.approx(1 / throughput["wall_seconds"], rel=0.05)
    with samples.open("a") as handle:
        handle.write(lines[0])  # a complete record without its newline is torn too
    # the file holds 3 prompts; a summary of 1 would disagree with it
    with pytest.raises(
        RolloutError, match=r"holds sample 0 of prompt 1, outside this run's 1 prompts x 1 samples"
    ):
        await run_rollout(RolloutOptions(data=DEMO, out=tmp_path, limit=1, resume=True, quiet=True))
    assert samples.read_text().endswith(lines[0]), "a refused resume changes nothing"
    grown = await run_rollout(
        RolloutOptions(data=DEMO, out=tmp_path, limit=3, n_samples=2, resume=True, quiet=True)
    )
    assert grown["samples"] == 6 and len(samples.read_text().splitlines()) == 6


def test_a_look_alike_chat_format_is_refused_in_one_line_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    family_files = pytest.importorskip("family_files")
    if family_files.package_data() is None:
        pytest.skip(family_files.MISSING)
    qwq = family_files.model_dir("qwq")
    out = tmp_path / "r"
    message = _error_line(
        capsys, ["rollout", "--data", str(DEMO), "--tokenizer", str(qwq), "--out", str(out)]
    )
    assert message.startswith(
        f"error: the tokenizer '{qwq}' from --tokenizer: the tokenizer's chat format is QwQ-32B"
    )
    assert not out.exists()


def test_a_second_run_into_a_busy_out_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs into one --out would interleave their samples: the second is refused, naming the first,
    and a run killed while holding the lock leaves no lock behind."""
    from strands_slime.rollout.run_files import LOCK, RunDir

    out = tmp_path / "r"
    argv = ["rollout", "--data", str(DEMO), "--limit", "1", "--out", str(out), "--quiet"]
    running = RunDir(out)
    running.lock()
    try:
        message = _error_line(capsys, argv)
        assert message.startswith(f"error: --out {out} is in use by another rollout (pid {os.getpid()} on ")
        assert message.endswith("): wait for it to end, or pick another --out")
        assert _error_line(capsys, [*argv, "--resume"]) == message, "--resume is refused alike"
        # the run that took the lock after this one's check: refused when it opens the directory
        with pytest.raises(RolloutError, match="is in use by another rollout"):
            await_run(RolloutOptions(data=DEMO, out=out, limit=1, quiet=True), skip_validate=True)
    finally:
        running.release()
    assert not (out / LOCK).exists()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from strands_slime.rollout.run_files import RunDir; "
            "RunDir(Path(sys.argv[1])).lock(); print('locked', flush=True); time.sleep(120)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        assert f"(pid {holder.pid} on " in _error_line(capsys, argv)
    finally:
        holder.kill()
        holder.wait()
    assert (out / LOCK).exists(), "a killed run leaves its lock file"
    assert main(argv) == 0, "but not its lock"
    assert len((out / "samples.jsonl").read_text().splitlines()) == 1 and not (out / LOCK).exists()


def await_run(options: RolloutOptions, *, skip_validate: bool = False) -> dict[str, Any]:
    """``run_rollout`` on a loop of its own (from a synchronous test); ``skip_validate`` stands for a run
    whose check passed before another run took the directory."""
    import asyncio

    if skip_validate:
        options.validate = lambda: None  # type: ignore[method-assign]
    return asyncio.run(run_rollout(options))


def test_resume_refuses_settings_that_change_what_samples_mean_and_announces_new_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "problems.jsonl"
    lines = DEMO.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[:1]))
    out = tmp_path / "r"
    argv = ["rollout", "--data", str(data), "--out", str(out), "--quiet"]
    assert main(argv) == 0
    assert json.loads((out / "run_settings.json").read_text())["temperature"] == 1.0
    message = _error_line(capsys, [*argv, "--resume", "--temperature", "0.2", "--eval"])
    assert message == (
        f"error: --resume would mix samples of other settings into {out}: --temperature 0.2 (the run used "
        "1.0); --eval on (the run used off); resume with the run's settings, or use another --out"
    )
    config = tmp_path / "config.yaml"
    config.write_text("strands_slime:\n  max_tool_iters: 2\n  client:\n    max_retries: 3\n")
    message = _error_line(capsys, [*argv, "--resume", "--config", str(config)])
    assert "the rollout config (--config: max_tool_iters)" in message, "client settings change no sample"
    # a run made before run_settings.json existed is checked against its summary
    (out / "run_settings.json").unlink()
    assert "--top-k 5 (the run used -1)" in _error_line(capsys, [*argv, "--resume", "--top-k", "5"])
    data.write_text("".join(lines[:3]))
    assert main([*argv[:-1], "--resume"]) == 0  # not --quiet: the note is no error
    assert capsys.readouterr().err.strip().splitlines()[0] == (
        f"note: {data} has 3 prompts, 1 when the run in {out} began: --resume runs the 2 new ones too"
    )
    assert len((out / "samples.jsonl").read_text().splitlines()) == 3


def test_a_server_rejecting_every_request_stops_the_run_without_blaming_its_health(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(NO_RETRIES)
    out = tmp_path / "r"
    with DevServerThread("scripted", script=SCRIPT) as server:
        inject_fault(server, status=400, count=10_000, message="max_new_tokens is too large")
        argv = ["rollout", "--data", str(DEMO), "--base-url", server.url, "--config", str(config)]
        assert main([*argv, "--n-samples", "2", "--concurrency", "3", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    error = _lines_besides_the_progress_bar(err)[-1]
    assert (
        error.startswith("error: stopped early: the last 3 samples all failed (latest: ")
        and "HTTP 400" in error
    )
    assert error.endswith(
        "; the server rejects these requests (a bad request, not a sick server): fix what it names, then "
        "--resume runs the rest and the failed samples again"
    )
    assert json.loads((out / "summary.json").read_text())["stopped_by_rejections"] is True


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"strands-slime {importlib.metadata.version('strands-slime')}\n"


async def test_the_health_probe_waits_for_a_server_that_is_still_starting() -> None:
    """``serve ... &`` then ``rollout``: the server may not listen yet when the probe starts."""
    import asyncio

    from strands_slime.rollout.offline import probe_server

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = DevServerThread("scripted", script=SCRIPT, port=port)

    async def start_later() -> None:
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.start)

    try:
        info, _ = await asyncio.gather(probe_server(f"http://127.0.0.1:{port}", 60), start_later())
    finally:
        server.stop()
    assert isinstance(info, dict)
    with pytest.raises(RolloutError, match=r"is unreachable for 0.5 s \(--health-timeout\): "):
        await probe_server(f"http://127.0.0.1:{port}", 0.5)


def test_a_terminal_sees_the_start_up_until_the_bar_or_the_error_replaces_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    argv = ["rollout", "--data", str(DEMO), "--base-url", "http://127.0.0.1:9", "--health-timeout", "0.5"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    status = f"rollout: starting: {DEMO} on http://127.0.0.1:9 (data, tokenizer, sandbox, server)\r"
    assert err.startswith(status + "\r\033[K" + "error: server http://127.0.0.1:9 is unreachable for 0.5 s")
    assert err.count("\n") == 1, "the error is still one line"
    assert main([*argv, "--quiet", "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.startswith("error: "), "--quiet: no status"
