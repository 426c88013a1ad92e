"""One Ctrl-C ends an offline rollout, wherever it lands: at start-up, while episodes run their tool
calls, while requests retry a failing server. Each interrupt ends the run within seconds with its one
``interrupted by SIGINT`` line (or the start-up's), and a run that saved samples has its ``summary.json``
(issue 37: 2 of 11 Ctrl-Cs left the run idle for minutes)."""

from __future__ import annotations

import faulthandler
import json
import os
import random
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.devserver_runners import DevServerThread
from benchmarks.fault_injection import set_fault_mix
from strands_slime.cli import main

pytestmark = pytest.mark.slow  # 10 runs: ~60 s

SEED = 37
RUNS = 10
LATEST_INTERRUPT_S = 8.0
"""Interrupts land up to this long after the run started: it cannot finish before (>= 14 s of
scripted latency and tool calls on any machine: 20 waves of 8 episodes, each >= 0.7 s)."""
ENDS_WITHIN_S = 30.0
"""A hang detector, not a speed test: a stopped run ends in about a second even on a loaded machine."""
TOOL = '<tool_call>\n{{"name": "execute_python_code", "arguments": {{"code": "{code}"}}}}\n</tool_call>'
SCRIPT = {
    "rules": [
        {
            "match": "problem",
            "replies": [
                TOOL.format(code="import time; time.sleep(0.2); print(1)"),
                TOOL.format(code="import time; time.sleep(0.1); print(2)"),
                TOOL.format(code="print(3)"),
                "Answer: \\boxed{3}",
            ],
        }
    ]
}
RETRIES = "strands_slime:\n  client:\n    retry_delay_s: 0.05\n    max_retry_delay_s: 0.2\n"
FAULTS = [
    {"status": 500, "weight": 0.2},
    {"delay_s": 0.5, "weight": 0.1},
    {"drop_connection": True, "weight": 0.05},
]


class _Interrupter(threading.Thread):
    """Sends SIGINT ``delay_s`` after ``main`` installed its first handler (asyncio.run's), unless the
    run ended first."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(daemon=True)
        self.delay_s = delay_s
        self.sent_at: float | None = None
        self.lock = threading.Lock()
        self.finished = False

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            if time.monotonic() > deadline or self.finished:
                return
            time.sleep(0.005)
        time.sleep(self.delay_s)
        with self.lock:
            if not self.finished:
                self.sent_at = time.monotonic()
                os.kill(os.getpid(), signal.SIGINT)

    def end(self) -> None:
        with self.lock:
            self.finished = True


def test_one_ctrl_c_anywhere_ends_the_run_with_its_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(SEED)
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"problem {i}", "label": "3"}) + "\n" for i in range(80)))
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    config = tmp_path / "config.yaml"
    config.write_text(RETRIES)
    seen: set[str] = set()
    with DevServerThread("scripted", script=script, latency=0.1) as server:
        set_fault_mix(server, FAULTS, seed=SEED)
        for run in range(RUNS):
            out = tmp_path / f"run{run}"
            argv = ["rollout", "--data", str(data), "--base-url", server.url, "--config", str(config)]
            argv += ["--n-samples", "2", "--concurrency", "8", "--quiet", "--out", str(out)]
            interrupter = _Interrupter(rng.uniform(0.0, LATEST_INTERRUPT_S))
            watchdog = threading.Timer(ENDS_WITHIN_S + LATEST_INTERRUPT_S + 60, _dump_and_die)
            watchdog.start()
            interrupter.start()
            try:
                code = main(argv)
            finally:
                interrupter.end()
                watchdog.cancel()
            ended = time.monotonic()
            assert interrupter.sent_at is not None, f"run {run} ended before its interrupt"
            assert ended - interrupter.sent_at < ENDS_WITHIN_S, (
                f"run {run}: {ended - interrupter.sent_at:.1f} s"
            )
            assert code == 128 + signal.SIGINT
            captured = capsys.readouterr()
            assert captured.out == ""
            [line] = captured.err.strip().splitlines()
            samples = out / "samples.jsonl"
            if line == "interrupted before any sample started; nothing was written":
                seen.add("start-up")
                assert not samples.exists()
                continue
            saved = re.fullmatch(
                rf"interrupted by SIGINT: (\d+) of 160 samples are saved in {re.escape(str(samples))}; "
                "--resume runs the rest",
                line,
            )
            if saved is None:
                assert line == "interrupted by SIGINT: no sample finished, nothing was saved", line
                assert not out.exists(), "a run that saved nothing leaves nothing"
                seen.add("episodes")
                continue
            seen.add("after samples")
            summary = json.loads((out / "summary.json").read_text())
            assert summary["interrupted"] == "SIGINT"
            assert summary["samples"] == int(saved.group(1)) == len(samples.read_text().splitlines())
    assert "after samples" in seen, seen


def _dump_and_die() -> None:
    """The run hangs: show every thread and end the test run (a hang must not hang CI; pytest's own
    timeout cannot interrupt a loop that waits for nothing)."""
    try:
        print(f"\n{__name__}: a Ctrl-C'd run did not end; the threads:", file=sys.__stderr__, flush=True)
        faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
    finally:
        os._exit(3)
