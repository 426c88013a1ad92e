"""Event-loop stall while slime starts many episodes at once (issue 12, point 7).

    python benchmarks/bench_startup.py                    # 1,024 episodes, report as text
    python benchmarks/bench_startup.py --episodes 256 --json
    python benchmarks/bench_startup.py --cold-tokenizer   # our code loads the tokenizer too
    python benchmarks/bench_startup.py --abort-after 10   # the server hangs; slime aborts after 10 s

One fresh process, the scripted dev server in a child process (it answers every episode in one turn,
and its CPU, GIL and garbage stay out of the measurement, as SGLang's do in slime); ``generate`` is called for N samples at the same instant, as slime's rollout does, with
the shipped configuration (Python tool included, so the sandbox zygote starts cold). A watchdog task
wakes every 2 ms and records, between two wakes, the CPU time of the loop's own thread
(``time.thread_time``) and the wall time. The CPU figure is what one loop iteration cost us: unlike
wall time it does not grow when other processes take the CPU (a 2-core machine shared by others) or
when the server thread holds the GIL. Both maxima are reported; the goal is CPU max <= 50 ms.

By default the tokenizer is loaded before the measurement, as in slime, whose ``GenerateState``
loads it before any custom generate runs (our generate reuses it). ``--cold-tokenizer`` measures our
own loading too: it runs in a worker thread, but transformers parses tokenizer.json with ``json``
while holding the GIL, so the loop's wall time stalls about a second once (its CPU does not).

``--abort-after S``: the server never answers (600 s latency); S seconds after the start the abort
flag is set (``args.abort_event``, slime's ``GenerateState.aborted``), and the time until every
``generate`` returned and the loop's longest iteration from then on are reported (goals: <= 1 s,
<= 50 ms, every sample ABORTED).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

WATCHDOG_PERIOD_S = 0.002
GOAL_MS = 50.0
PROMPT = "What is 2 + 3? Put the answer in a box."
SCRIPT = [{"match": None, "replies": ["<think>\nEasy.\n</think>\n\nIt is 5.\n\nAnswer: \\boxed{5}"]}]


class LoopWatchdog:
    """Largest per-wake CPU (this thread) and wall gaps of the running loop, and the longest pause of
    the garbage collector (part of those gaps, reported apart)."""

    def __init__(self) -> None:
        self.max_cpu_s = 0.0
        self.max_wall_s = 0.0
        self.max_gc_s = 0.0
        self.wakes = 0
        self._task: asyncio.Task[None] | None = None
        self._gc_started = 0.0

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.max_gc_s = max(self.max_gc_s, time.perf_counter() - self._gc_started)

    async def _watch(self) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        while True:
            await asyncio.sleep(WATCHDOG_PERIOD_S)
            now_wall, now_cpu = time.perf_counter(), time.thread_time()
            self.max_cpu_s = max(self.max_cpu_s, now_cpu - cpu)
            self.max_wall_s = max(self.max_wall_s, now_wall - wall - WATCHDOG_PERIOD_S)
            self.wakes += 1
            wall, cpu = now_wall, now_cpu

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        assert self._task is not None
        gc.callbacks.remove(self._on_gc)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def slime_like_args(url: str) -> SimpleNamespace:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return SimpleNamespace(
        sglang_router_ip=host,
        sglang_router_port=int(port),
        sglang_server_concurrency=1024,
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        router_policy="consistent_hashing",
        hf_checkpoint=None,  # the bundled Qwen3 tokenizer
        rollout_max_response_len=1024,
        rollout_max_context_len=None,
        partial_rollout=False,
        reward_key=None,
        eval_reward_key=None,
        abort_event=None,
    )


async def measure(episodes: int, url: str, abort_after: float | None = None) -> dict[str, Any]:
    import threading

    from strands_slime import generate
    from strands_slime.rollout.slime_compat import Sample

    args = slime_like_args(url)
    aborted = threading.Event()
    args.abort_event = aborted
    params = {"temperature": 1.0, "max_new_tokens": 1024, "skip_special_tokens": False, "no_stop_trim": True}
    samples = [
        Sample(prompt=[{"role": "user", "content": f"{PROMPT} ({i})"}], index=i, group_index=i, label="5")
        for i in range(episodes)
    ]
    watchdog = LoopWatchdog()
    watchdog.start()
    await asyncio.sleep(0.05)  # a few wakes first: the watchdog's own start is not measured
    started = time.perf_counter()
    running = asyncio.gather(*(generate(args, sample, dict(params)) for sample in samples))
    abort_report: dict[str, Any] = {}
    if abort_after is not None:
        await asyncio.wait({running}, timeout=abort_after)
        start_up = watchdog.max_cpu_s
        watchdog.max_cpu_s = watchdog.max_wall_s = 0.0  # from here on: the abort
        aborted.set()
        set_at = time.perf_counter()
        await running
        abort_report = {
            "abort_to_return_s": round(time.perf_counter() - set_at, 3),
            "start_up_max_loop_cpu_ms": round(start_up * 1000, 2),
        }
    done = await running
    seconds = time.perf_counter() - started
    await watchdog.stop()
    statuses: dict[str, int] = {}
    for sample in done:
        name = str(getattr(sample.status, "value", sample.status))
        statuses[name] = statuses.get(name, 0) + 1
    return {
        "episodes": episodes,
        "seconds": round(seconds, 3),
        "max_loop_cpu_ms": round(watchdog.max_cpu_s * 1000, 2),
        "max_loop_wall_ms": round(watchdog.max_wall_s * 1000, 2),
        "max_gc_pause_ms": round(watchdog.max_gc_s * 1000, 2),
        "watchdog_wakes": watchdog.wakes,
        "statuses": statuses,
        "goal_ms": GOAL_MS,
        **abort_report,
    }


def run(episodes: int, cold_tokenizer: bool = False, abort_after: float | None = None) -> dict[str, Any]:
    """Measure in this process (call it in a fresh one: start-up work must be cold)."""
    try:
        from benchmarks.devserver_runners import DevServerProcess
    except ImportError:  # run as a script: benchmarks/ is on sys.path
        from devserver_runners import DevServerProcess
    from strands_slime.provider.tokenizer import load_tokenizer

    if not cold_tokenizer:
        load_tokenizer(None)  # what slime's GenerateState has done before calling us
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps(SCRIPT))
        server_args = ["--backend", "scripted", "--script", str(script), "--log-level", "warning"]
        server_args += ["--max-running-requests", str(episodes), "--request-log-size", "1"]
        if abort_after is not None:
            server_args += ["--latency", "600"]
        with DevServerProcess(server_args) as server:
            result = asyncio.run(measure(episodes, server.url, abort_after))
    result["cold_tokenizer"] = cold_tokenizer
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=1024, help="episodes started at once (default 1024)")
    parser.add_argument("--cold-tokenizer", action="store_true", help="let generate load the tokenizer too")
    parser.add_argument(
        "--abort-after", type=float, metavar="S", help="hanging server; set the abort flag after S seconds"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    options = parser.parse_args(argv)
    if options.episodes < 1:
        parser.error("--episodes must be >= 1")
    if options.abort_after is not None and options.abort_after <= 0:
        parser.error("--abort-after must be > 0")
    result = run(options.episodes, options.cold_tokenizer, options.abort_after)
    if options.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['episodes']} episodes in {result['seconds']} s: max loop iteration "
            f"{result['max_loop_cpu_ms']} ms CPU (goal <= {GOAL_MS:g} ms), {result['max_loop_wall_ms']} ms wall, "
            f"longest GC pause {result['max_gc_pause_ms']} ms; "
            f"statuses {result['statuses']}"
        )
        if "abort_to_return_s" in result:
            print(
                f"abort: every generate returned {result['abort_to_return_s']} s after the flag (goal <= 1 s); "
                f"the loop figures above are from the abort on (start-up: {result['start_up_max_loop_cpu_ms']} ms)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
