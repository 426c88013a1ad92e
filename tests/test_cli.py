"""strands-slime rollout/demo: same code path as slime, written results and summary."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until_sync

from strands_slime.cli import RolloutOptions, main, run_rollout
from strands_slime.devserver import DevServerThread

pytestmark = pytest.mark.integration

DATA_DIR = Path(__file__).resolve().parents[1] / "strands_slime" / "data"
DEMO = DATA_DIR / "demo_problems.jsonl"
SCRIPT = DATA_DIR / "demo_script.json"


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
    # --quiet: no progress bar, no summary; only the path of the HTML report
    assert result.stdout == f"report: {tmp_path / 'report.html'}\n"
    assert json.loads((tmp_path / "summary.json").read_text())["samples"] == 2


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI in-process; it must exit 2 with exactly one ``error:`` line on stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
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
    assert f"cannot load the tokenizer '{not_a_tokenizer}' from --tokenizer" in message
    with pytest.raises(Exception, match="not JSON"):  # --debug: the real exception and traceback
        main(["rollout", "--data", str(bad), "--debug", *out])


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


def test_a_run_where_samples_fail_exits_nonzero_with_the_reasons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("strands_slime:\n  client:\n    max_retries: 0\n")
    with DevServerThread("scripted", script=SCRIPT) as server:
        server.inject_fault(status=500, count=1000, message="engine on fire")
        argv = ["rollout", "--data", str(DEMO), "--base-url", server.url, "--config", str(config)]
        code = main([*argv, "--out", str(tmp_path / "r")])
        captured = capsys.readouterr()
        assert code == 1
        assert "failed: 5 of 5 (100.0%); top reasons:" in captured.out and "engine on fire" in captured.out
        assert "more than --max-failure-rate 0.1" in captured.err
        assert main([*argv, "--max-failure-rate", "1", "--quiet", "--out", str(tmp_path / "q")]) == 0
        # --quiet: no summary either, only the report's path
        assert capsys.readouterr().out == f"report: {tmp_path / 'q' / 'report.html'}\n"
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["failures"]["failed"] == 5 and summary["failures"]["top_reasons"][0]["count"] == 5


def _wait_for_lines(path: Path, count: int, deadline_s: float) -> None:
    wait_until_sync(
        lambda: path.exists() and len(path.read_text().splitlines()) >= count,
        timeout=deadline_s,
        what=f"{path} to reach {count} lines",
    )


@pytest.mark.slow  # 57 s
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_keeps_finished_samples_and_resume_runs_the_rest(tmp_path: Path, signum: int) -> None:
    samples = tmp_path / "samples.jsonl"
    with DevServerThread("scripted", script=SCRIPT, latency=0.3) as server:
        argv = [sys.executable, "-m", "strands_slime.cli", "rollout", "--data", str(DEMO), "--quiet"]
        argv += ["--base-url", server.url, "--n-samples", "4", "--concurrency", "2", "--out", str(tmp_path)]
        process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for_lines(samples, 2, deadline_s=120)
            process.send_signal(signum)
            _, stderr = process.communicate(timeout=20)
        finally:
            process.kill()
        assert process.returncode == 128 + signum, stderr
        kept = [json.loads(line) for line in samples.read_text().splitlines()]
        assert 2 <= len(kept) < 20
        assert f"samples finished and saved in {samples} (--resume runs the rest)" in stderr.splitlines()[-1]
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["interrupted"] == signal.Signals(signum).name and summary["samples"] == len(kept)

        server.clear_request_log()
        resumed = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    keys = [(r["group_index"], r["sample_index"]) for r in records]
    assert sorted(keys) == [(g, k) for g in range(5) for k in range(4)]  # each exactly once
    assert records[: len(kept)] == kept  # the finished samples were kept as they were
    assert json.loads((tmp_path / "summary.json").read_text())["samples"] == 20


def test_resume_refuses_another_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "samples.jsonl").write_text(
        json.dumps({"group_index": 0, "sample_index": 0, "prompt": "another prompt"}) + "\n"
    )
    argv = ["rollout", "--data", str(DEMO), "--resume", "--out", str(tmp_path)]
    assert "holds other prompts than" in _error_line(capsys, argv)
    (tmp_path / "samples.jsonl").write_text('{"group_index": 0, "sampl\n{"group_index": 1}\n')
    assert "samples.jsonl:1: not JSON; cannot resume from it" in _error_line(capsys, argv)
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
    assert "(default: None)" not in text and "(default: False)" not in text


def test_serve_delegates_to_the_dev_server(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["serve", "--help"])
    except SystemExit as exc:
        code = exc.code
    assert code == 0
    assert "--backend" in capsys.readouterr().out


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
async def test_wandb_offline_logs_zeros_and_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    options = RolloutOptions(data=DEMO, out=tmp_path, limit=1, quiet=True, wandb=True, temperature=0.7)
    await run_rollout(options)
    [run_file] = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = _wandb_records(run_file)
    history: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            history.update(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
        if record.WhichOneof("record_type") == "run":  # the config travels with the run record
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
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


async def test_resume_drops_a_torn_last_line_and_counts_only_the_planned_samples(tmp_path: Path) -> None:
    await run_rollout(RolloutOptions(data=DEMO, out=tmp_path, limit=2, quiet=True))
    samples = tmp_path / "samples.jsonl"
    first = samples.read_text().splitlines()
    with samples.open("a") as handle:
        handle.write('{"group_index": 1, "sample_index": 0, "tok')  # killed mid-write
    summary = await run_rollout(RolloutOptions(data=DEMO, out=tmp_path, limit=3, resume=True, quiet=True))
    lines = samples.read_text().splitlines()
    assert lines[:2] == first and len(lines) == 3
    assert sorted(json.loads(line)["group_index"] for line in lines) == [0, 1, 2]
    with samples.open("a") as handle:
        handle.write(lines[0])  # a complete record without its newline is torn too
    smaller = await run_rollout(RolloutOptions(data=DEMO, out=tmp_path, limit=1, resume=True, quiet=True))
    assert summary["samples"] == 3 and smaller["samples"] == 1 and len(samples.read_text().splitlines()) == 3
