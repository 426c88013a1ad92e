"""Episode executor: turns/s and slime's loop stall, in-process vs N worker processes vs N Ray actors
(issues 17 and 31).

    python benchmarks/bench_executor.py                          # 256/1024/4096 episodes; in-process, 1, 2, N workers
    python benchmarks/bench_executor.py --concurrency 256 --workers 0 2 --json
    python benchmarks/bench_executor.py --tool-turns 0           # one model call per episode, no sandbox
    python benchmarks/bench_executor.py --workers 2 --ray-workers 2   # local processes vs Ray actors
    python benchmarks/bench_executor.py --workers --ray-workers 16 64 --ray-address auto  # on a Ray cluster

Stands in for slime's rollout process: one event loop calls ``strands_slime.generate`` for C samples
at the same instant (slime's ``asyncio.gather``), with the shipped configuration (real sandbox tool)
plus ``executor: {workers: W}``; ``W = 0`` is the in-process path. Every episode makes
``--tool-turns`` Python tool calls (``print(6 * 7)``) and then answers, against the scripted dev
server in its own process (``--latency``, default 0). ``--ray-workers W`` runs the same episodes in W
Ray actors (``executor: {backend: ray}``): on a Ray instance this case starts on this machine
(``num_cpus`` = the usable cores, at least W), or on the cluster ``--ray-address`` names (``auto``
from a node of it; the dev server must then listen where the actors reach it: ``--host``). Each
case runs in a fresh process: a warm-up of a few episodes first (it starts the workers, the sandbox,
the tokenizer), then C episodes are measured.

Reported per case:

* **turns/s**: model calls finished per second of wall time;
* **loop stall**: a 2 ms ticker on slime's loop records how late it wakes (wall p99 / max) and the
  CPU of the loop's thread between two wakes (``time.thread_time``: what one loop iteration cost,
  which other processes on a shared machine do not inflate);
* **CPU ms/turn**: of slime's process (all threads: Ray's own threads in it included), of the
  workers (``/proc``, so only workers on this machine; the sandbox's processes are left out in all
  paths);
* **crossing**: bytes per episode both ways and the CPU slime's loop spent encoding the episode and
  decoding and applying its result (µs per episode), and the workers' packing time.

The machine is recorded (cores, load average before and after each case): on a shared machine
compare only cases run back to back, and rerun on a quiet one for numbers to keep.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

TICK_S = 0.002
WARM_UP_EPISODES = 8
PROMPT = "Compute six times seven with Python, then answer. ({index})"


def tool_call(code: str) -> str:
    """A Qwen3 (hermes) tool call of the sandboxed Python tool."""
    body = json.dumps({"name": "execute_python_code", "arguments": {"code": code}})
    return f"<tool_call>\n{body}\n</tool_call>"


def script(tool_turns: int) -> list[dict[str, Any]]:
    """One rule for every episode: ``tool_turns`` tool calls, then the boxed answer."""
    replies = [
        f"<think>\nI will check it (step {turn}).\n</think>\n\n{tool_call('print(6 * 7)')}"
        for turn in range(tool_turns)
    ]
    replies.append("<think>\nThe tool printed 42.\n</think>\n\nIt is 42.\n\nAnswer: \\boxed{42}")
    return [{"match": None, "replies": replies}]


class LoopTicker:
    """How late a 2 ms timer wakes on this loop (wall) and the loop thread's CPU between two wakes."""

    def __init__(self) -> None:
        self.wall_lag_s: list[float] = []
        self.cpu_s: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        while True:
            await asyncio.sleep(TICK_S)
            now_wall, now_cpu = time.perf_counter(), time.thread_time()
            self.wall_lag_s.append(max(0.0, now_wall - wall - TICK_S))
            self.cpu_s.append(now_cpu - cpu)
            wall, cpu = now_wall, now_cpu

    def start(self) -> None:
        """Start ticking on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        """Stop ticking."""
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of one process from /proc (0.0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _slime_args(url: str, workers: int, concurrency: int, backend: str = "local") -> SimpleNamespace:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    config: dict[str, Any] = {}
    if workers and backend == "ray":
        config["executor"] = {"backend": "ray", "workers": workers}
    elif workers:
        config["executor"] = {"workers": workers, "oversubscribe": True}
    return SimpleNamespace(
        sglang_router_ip=host,
        sglang_router_port=int(port),
        sglang_server_concurrency=max(concurrency, 64),
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        router_policy="consistent_hashing",
        hf_checkpoint=None,  # the bundled Qwen3 tokenizer
        rollout_max_response_len=4096,
        rollout_max_context_len=None,
        partial_rollout=False,
        reward_key=None,
        eval_reward_key=None,
        abort_event=threading.Event(),
        strands_slime=config,
    )


async def measure(url: str, workers: int, concurrency: int, backend: str = "local") -> dict[str, Any]:
    """One case in this process: warm up, then ``concurrency`` episodes at once."""
    from strands_slime import generate
    from strands_slime.rollout import executor
    from strands_slime.rollout.slime_compat import Sample

    args = _slime_args(url, workers, concurrency, backend)
    params = {"temperature": 1.0, "max_new_tokens": 4096, "skip_special_tokens": False, "no_stop_trim": True}

    def samples(count: int, offset: int) -> list[Any]:
        return [
            Sample(
                prompt=[{"role": "user", "content": PROMPT.format(index=offset + i)}], index=i, group_index=i
            )
            for i in range(count)
        ]

    warm = await asyncio.gather(*(generate(args, s, dict(params)) for s in samples(WARM_UP_EPISODES, 10**6)))
    assert all(s.status.name == "COMPLETED" for s in warm), [s.metadata.get("infra_error") for s in warm]
    running = None
    if workers:
        from strands_slime.config import get_rollout_config

        running = await executor.get_executor(args, get_rollout_config(args))
        base = executor.ExecutorStats(**vars(running.stats))
        worker_pids = running.worker_pids
        if backend == "ray":  # /proc sees only the actors on this machine's node
            import ray

            here = ray.get_runtime_context().get_node_id()
            worker_pids = [p for p, n in zip(worker_pids, running.worker_nodes, strict=True) if n == here]
    batch = samples(concurrency, 0)
    gc.collect()
    ticker = LoopTicker()
    ticker.start()
    await asyncio.sleep(0.05)
    worker_cpu0 = sum(_proc_cpu_s(pid) for pid in worker_pids) if running else 0.0
    cpu0, started = time.process_time(), time.perf_counter()
    done = await asyncio.gather(*(generate(args, s, dict(params)) for s in batch))
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    worker_cpu = (sum(_proc_cpu_s(pid) for pid in worker_pids) - worker_cpu0) if running else 0.0
    await ticker.stop()
    turns = sum(int(s.metadata.get("turns", 0)) for s in done)
    statuses: dict[str, int] = {}
    for sample in done:
        statuses[sample.status.name] = statuses.get(sample.status.name, 0) + 1
    result: dict[str, Any] = {
        "backend": backend if workers else "in-process",
        "workers": workers,
        "concurrency": concurrency,
        "episodes": len(done),
        "turns": turns,
        "seconds": round(seconds, 3),
        "turns_per_s": round(turns / seconds, 1),
        "loop_lag_p99_ms": round(_percentile(ticker.wall_lag_s, 0.99) * 1000, 1),
        "loop_lag_max_ms": round(max(ticker.wall_lag_s, default=0.0) * 1000, 1),
        "loop_cpu_p99_ms": round(_percentile(ticker.cpu_s, 0.99) * 1000, 2),
        "loop_cpu_max_ms": round(max(ticker.cpu_s, default=0.0) * 1000, 2),
        "slime_cpu_ms_per_turn": round(cpu / max(turns, 1) * 1000, 3),
        "worker_cpu_ms_per_turn": round(worker_cpu / max(turns, 1) * 1000, 3),
        "statuses": statuses,
    }
    if running is not None:
        stats = running.stats
        episodes = max(stats.episodes - base.episodes, 1)
        result.update(
            bytes_to_worker_per_episode=round((stats.bytes_sent - base.bytes_sent) / episodes),
            bytes_from_worker_per_episode=round((stats.bytes_received - base.bytes_received) / episodes),
            slime_codec_us_per_episode=round(
                (stats.parent_codec_seconds - base.parent_codec_seconds) / episodes * 1e6, 1
            ),
            worker_pack_us_per_episode=round(
                (stats.worker_codec_seconds - base.worker_codec_seconds) / episodes * 1e6, 1
            ),
            response_tokens_per_episode=round(statistics.mean(s.response_length for s in done)),
            tokens_per_episode=round(statistics.mean(len(s.tokens) for s in done)),
        )
        await executor.shutdown_executors()
    return result


def codec_cost(tokens: int, repeats: int = 200) -> dict[str, Any]:
    """Crossing cost of one finished sample of ``tokens`` tokens (3/4 of them response, tool segments
    included): the worker's pack + pickle, and slime's unpickle + apply, in CPU µs (this thread), and
    the bytes; next to it, the size of the whole Sample pickled as it is."""
    import pickle
    import random

    from strands_slime.rollout import executor, executor_worker
    from strands_slime.rollout.slime_compat import Sample

    rng = random.Random(0)
    response = tokens * 3 // 4
    sample = Sample(prompt=[{"role": "user", "content": "x" * 2000}], index=1, group_index=1, label="42")
    sample.tokens = [rng.randrange(151_000) for _ in range(tokens)]
    sample.response_length = response
    sample.loss_mask = [int(rng.random() < 0.8) for _ in range(response)]
    sample.rollout_log_probs = [-rng.random() * 3 if mask else 0.0 for mask in sample.loss_mask]
    sample.response = "y" * (response * 4)
    sample.weight_versions = ["7"] * 8
    sample.status = Sample.Status.COMPLETED
    sample.metadata = {"turns": 8, "turn_seconds": [0.5] * 8, "final_text": "z" * 2000, "tool_calls": 7}
    worker = time.thread_time()
    for _ in range(repeats):
        payload = pickle.dumps(("done", 0, [executor_worker.pack_result(sample)]), protocol=5)
    worker = (time.thread_time() - worker) / repeats
    target = Sample(prompt=sample.prompt)
    parent = time.thread_time()
    for _ in range(repeats):
        executor.apply_result(target, pickle.loads(payload)[2][0])
    parent = (time.thread_time() - parent) / repeats
    assert target.tokens == sample.tokens and target.rollout_log_probs == sample.rollout_log_probs
    whole = len(pickle.dumps(sample, protocol=5))
    return {
        "tokens": tokens,
        "bytes": len(payload),
        "whole_sample_pickle_bytes": whole,
        "worker_pack_us": round(worker * 1e6, 1),
        "slime_decode_apply_us": round(parent * 1e6, 1),
    }


def _connect_ray(workers: int, address: str | None) -> None:
    """This process as slime's rollout actor: connected to a Ray cluster (a new one on this machine
    without ``address``)."""
    import logging

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    else:
        ray.init(
            num_cpus=max(workers, machine()["cores"]),
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )


def run_case(
    workers: int,
    concurrency: int,
    tool_turns: int,
    latency: float,
    backend: str = "local",
    ray_address: str | None = None,
    host: str = "127.0.0.1",
) -> dict[str, Any]:
    """A fresh server and this process's measurement (call it in a fresh process)."""
    try:
        from benchmarks.devserver_runners import DevServerProcess
    except ImportError:  # run as a script: benchmarks/ is on sys.path
        from devserver_runners import DevServerProcess
    from strands_slime.provider.tokenizer import load_tokenizer

    load_tokenizer(None)  # slime's GenerateState has loaded it before any generate runs
    if backend == "ray":
        _connect_ray(workers, ray_address)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "script.json"
        path.write_text(json.dumps(script(tool_turns)))
        server_args = ["--backend", "scripted", "--script", str(path), "--log-level", "warning"]
        server_args += ["--max-running-requests", str(max(concurrency, 64)), "--request-log-size", "1"]
        server_args += ["--latency", str(latency), "--host", host]
        with DevServerProcess(server_args) as server:
            return asyncio.run(measure(server.url, workers, concurrency, backend))


def machine() -> dict[str, Any]:
    """What the numbers were taken on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = platform.processor() or platform.machine()
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "cores": cores, "python": platform.python_version(), "platform": platform.platform()}


def table(results: list[dict[str, Any]]) -> str:
    """The results as a Markdown table (one row per case)."""
    lines = [
        "| concurrent episodes | where episodes run | turns/s | loop lag p99 / max ms | loop CPU per iteration p99 / max ms "
        "| slime CPU ms/turn | workers CPU ms/turn | bytes per episode (to / from) | slime µs per episode "
        "| load avg before / after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        crossing = (
            f"{r['bytes_to_worker_per_episode']} / {r['bytes_from_worker_per_episode']}"
            if "bytes_to_worker_per_episode" in r
            else "–"
        )
        codec = str(r.get("slime_codec_us_per_episode", "–"))
        lines.append(
            f"| {r['concurrency']} | {_where(r)} | {r['turns_per_s']} "
            f"| {r['loop_lag_p99_ms']} / {r['loop_lag_max_ms']} | {r['loop_cpu_p99_ms']} / {r['loop_cpu_max_ms']} "
            f"| {r['slime_cpu_ms_per_turn']} | {r['worker_cpu_ms_per_turn'] or '–'} | {crossing} | {codec} "
            f"| {r['load_before']} / {r['load_after']} |"
        )
    return "\n".join(lines)


def _where(result: dict[str, Any]) -> str:
    if not result["workers"]:
        return "in-process"
    kind = "Ray actors" if result.get("backend") == "ray" else "processes"
    return f"{result['workers']} {kind}"


def codec_table(rows: list[dict[str, Any]]) -> str:
    """The crossing cost of large samples as a Markdown table."""
    lines = [
        "| sample tokens | bytes back | whole Sample pickled, bytes | worker pack + pickle CPU µs | slime unpickle + apply CPU µs |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokens']} | {r['bytes']} | {r['whole_sample_pickle_bytes']} | {r['worker_pack_us']} "
            f"| {r['slime_decode_apply_us']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every case in its own process and print the table (or JSON)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        help="worker counts to compare, 0 = in-process (default: 0 1 2 N, N = usable cores)",
    )
    parser.add_argument(
        "--ray-workers",
        type=int,
        nargs="*",
        default=[],
        help="Ray actor counts to compare (executor backend ray; needs the ray package)",
    )
    parser.add_argument(
        "--ray-address",
        help="run the Ray cases on this cluster (e.g. auto) instead of a Ray instance on this machine",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="where the dev server listens (on a cluster: an address of this node the actors reach)",
    )
    parser.add_argument("--tool-turns", type=int, default=2, help="tool calls per episode before the answer")
    parser.add_argument("--latency", type=float, default=0.0, help="server seconds before each reply")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--codec-only", action="store_true", help="only the crossing cost of large samples")
    parser.add_argument("--case", nargs=2, type=int, metavar=("WORKERS", "C"), help=argparse.SUPPRESS)
    parser.add_argument("--case-backend", default="local", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.case:
        result = run_case(
            options.case[0],
            options.case[1],
            options.tool_turns,
            options.latency,
            options.case_backend,
            options.ray_address,
            options.host,
        )
        print(json.dumps(result))
        return 0
    codec = [codec_cost(tokens) for tokens in (2_000, 16_000, 64_000)]
    if options.codec_only:
        print(json.dumps(codec) if options.json else codec_table(codec))
        return 0
    if any(c < 1 for c in options.concurrency) or options.tool_turns < 0 or options.latency < 0:
        parser.error("--concurrency must be >= 1, --tool-turns and --latency >= 0")
    cores = machine()["cores"]
    workers = options.workers if options.workers is not None else sorted({0, 1, 2, cores})
    if any(w < 0 for w in workers) or any(w < 1 for w in options.ray_workers):
        parser.error("--workers must be >= 0, --ray-workers >= 1")
    cases = [("local", count) for count in workers] + [("ray", count) for count in options.ray_workers]
    results = []
    for concurrency in options.concurrency:
        for backend, count in cases:
            load_before = round(os.getloadavg()[0], 2)
            command = [sys.executable, __file__, "--case", str(count), str(concurrency)]
            command += ["--tool-turns", str(options.tool_turns), "--latency", str(options.latency)]
            command += ["--case-backend", backend, "--host", options.host]
            command += ["--ray-address", options.ray_address] if options.ray_address else []
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            result = json.loads(output.strip().splitlines()[-1])
            result.update(load_before=load_before, load_after=round(os.getloadavg()[0], 2))
            results.append(result)
            print(
                f"C={concurrency} {_where(result)}: {result['turns_per_s']} turns/s, "
                f"loop lag max {result['loop_lag_max_ms']} ms, loop CPU max {result['loop_cpu_max_ms']} ms",
                file=sys.stderr,
            )
    report = {
        "codec": codec,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "tool_turns": options.tool_turns,
        "ray_address": options.ray_address,
        "latency": options.latency,
        "results": results,
    }
    if options.json:
        print(json.dumps(report))
    else:
        print(
            f"{report['date']}, {report['machine']['cpu']}, {cores} cores, Python {report['machine']['python']}"
        )
        print(table(results))
        print()
        print(codec_table(codec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
