"""Sandbox cost: per-call latency and CPU of strands_slime's zygote sandbox against camel-ai's
SubprocessInterpreter and a fresh interpreter per call, for trivial and sympy code, at 1 and 256
calls in flight, plus the event-loop lag the caller sees.

    python benchmarks/bench_sandbox.py [--quick]    # writes benchmarks/results/sandbox.json

``run(quick=False) -> dict`` and ``render_markdown(results) -> str`` are what docs/benchmarks.md uses.

Fairness: all three run the same code from one asyncio program with the same number of calls in
flight. camel's API is synchronous, so it runs in a thread pool as large as the concurrency (as
slime's strands example would have to); the fresh interpreter is ``python -c CODE`` started with
asyncio's subprocess API. camel runs ``python`` from PATH; the benchmark puts this interpreter's
directory first so that all three use the same Python and packages. CPU is everything the work
cost on the machine: the benchmark process plus every process it (or the zygote) started.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from strands_slime.sandbox import Sandbox, SandboxConfig  # noqa: E402

RESULTS_PATH = REPO_ROOT / "benchmarks" / "results" / "sandbox.json"

CODES = {
    "trivial": "print(1 + 1)",
    "sympy": "import sympy\nx = sympy.Symbol('x')\nprint(sympy.factor(x**4 - 1))",
}
EXPECTED = {"trivial": "2", "sympy": "(x - 1)*(x + 1)*(x**2 + 1)"}
RUNNERS = ("zygote", "zygote-shared-net", "camel", "fresh")

# calls per (code, concurrency, runner). With one call in flight the slow baselines get fewer
# calls; with 256 in flight every runner gets the same number, since latency there depends on how
# many calls queue behind the first wave. "zygote-shared-net" is the sandbox with
# network="shared" (one empty network namespace for all executions instead of one per execution).
FULL_CALLS = {
    ("trivial", 1): {"zygote": 300, "zygote-shared-net": 300, "camel": 60, "fresh": 60},
    ("sympy", 1): {"zygote": 100, "camel": 12, "fresh": 12},
    ("trivial", 256): {"zygote": 512, "zygote-shared-net": 512, "camel": 512, "fresh": 512},
    ("sympy", 256): {"zygote": 256, "camel": 256, "fresh": 256},
}
QUICK_CALLS = {
    ("trivial", 1): {"zygote": 60, "camel": 12, "fresh": 12},
    ("sympy", 1): {"zygote": 20, "camel": 3, "fresh": 3},
    ("trivial", 256): {"zygote": 256, "camel": 256, "fresh": 256},
    ("sympy", 256): {"zygote": 24, "camel": 24, "fresh": 24},
}
LAG_TICK_S = 0.001

TARGETS = {
    "trivial_p50_vs_camel": 0.25,
    "sympy_p50_vs_fresh": 0.05,
    "lag_256_ms": 10.0,
}


def _cpu_self_and_children() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _machine_busy_cpu() -> float:
    """Busy CPU-seconds of the whole machine (includes kernel work such as namespace teardown in
    kworkers, and anything else running on the machine)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _cpu_of_process_tree(pid: int | None) -> float:
    """CPU of a live process plus the children it has reaped (the zygote reaps every worker)."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


class _LagProbe:
    """How late a 1 ms sleep wakes up while calls are in flight.

    ``lags`` is wall-clock lateness: it includes time the process waited for a CPU, which on a
    saturated machine says nothing about blocking. ``busy`` is the CPU time the loop's thread spent
    between two ticks beyond the tick itself: that part is work done on the loop (blocking).
    """

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.busy: list[float] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            before = loop.time()
            cpu_before = time.thread_time()
            await asyncio.sleep(LAG_TICK_S)
            self.lags.append(max(0.0, loop.time() - before - LAG_TICK_S))
            self.busy.append(time.thread_time() - cpu_before)

    def __enter__(self) -> _LagProbe:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()

    async def finish(self) -> None:
        if self._task is not None:
            await self._task


async def _drive(call: Callable[[], Awaitable[str]], calls: int, concurrency: int) -> tuple[list[float], int]:
    """Run ``calls`` calls with at most ``concurrency`` in flight; latencies (s) and wrong outputs."""
    latencies: list[float] = []
    wrong = 0
    remaining = iter(range(calls))

    async def lane() -> None:
        nonlocal wrong
        for _ in remaining:
            began = time.perf_counter()
            output = await call()
            latencies.append(time.perf_counter() - began)
            wrong += output is None

    await asyncio.gather(*(lane() for _ in range(min(calls, concurrency))))
    return latencies, wrong


async def _measure(
    runner: str, code_name: str, concurrency: int, calls: int, state: dict[str, Any]
) -> dict[str, Any]:
    code = CODES[code_name]
    expected = EXPECTED[code_name]
    loop = asyncio.get_running_loop()

    if runner.startswith("zygote"):
        sandbox: Sandbox = state["sandbox"]

        async def call() -> str | None:
            result = await sandbox.run(code)
            return result.stdout.strip() if result.ok and result.stdout.strip() == expected else None

        def cpu_now() -> float:
            return _cpu_self_and_children() + _cpu_of_process_tree(sandbox.zygote_pid)

    elif runner == "camel":
        from camel.interpreters import SubprocessInterpreter

        interpreter = SubprocessInterpreter(require_confirm=False, print_stdout=False, print_stderr=False)
        executor: ThreadPoolExecutor = state["executor"]

        async def call() -> str | None:
            output = await loop.run_in_executor(executor, interpreter.run, code, "python")
            return output.strip() if output.strip() == expected else None

        cpu_now = _cpu_self_and_children

    else:

        async def call() -> str | None:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                code,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            stdout, _ = await process.communicate()
            text = stdout.decode().strip()
            return text if process.returncode == 0 and text == expected else None

        cpu_now = _cpu_self_and_children

    cpu_before = cpu_now()
    machine_before = _machine_busy_cpu()
    began = time.perf_counter()
    with _LagProbe() as probe:
        latencies, wrong = await _drive(call, calls, concurrency)
    await probe.finish()
    wall = time.perf_counter() - began
    if runner.startswith("zygote"):
        await asyncio.sleep(0.3)  # let the zygote reap the last workers so their CPU is counted
    cpu = cpu_now() - cpu_before
    machine = _machine_busy_cpu() - machine_before
    return {
        "runner": runner,
        "code": code_name,
        "concurrency": concurrency,
        "in_flight": min(calls, concurrency),
        "calls": calls,
        "wrong_outputs": wrong,
        "wall_s": round(wall, 3),
        "p50_ms": round(statistics.median(latencies) * 1e3, 3),
        "p99_ms": round(_percentile(latencies, 0.99) * 1e3, 3),
        "mean_ms": round(statistics.fmean(latencies) * 1e3, 3),
        "cpu_s_per_1000": round(cpu / calls * 1000, 2),
        "machine_cpu_s_per_1000": round(machine / calls * 1000, 2),
        "lag_max_ms": round(max(probe.lags, default=0.0) * 1e3, 3),
        "lag_p99_ms": round(_percentile(probe.lags, 0.99) * 1e3, 3) if probe.lags else 0.0,
        "loop_busy_max_ms": round(max(probe.busy, default=0.0) * 1e3, 3),
        "loop_busy_p99_ms": round(_percentile(probe.busy, 0.99) * 1e3, 3) if probe.busy else 0.0,
        "latencies_ms": [round(value * 1e3, 3) for value in latencies],
    }


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("strands-slime", "camel-ai", "sympy", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(
                (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), ""
            )
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "user": "root" if os.geteuid() == 0 else "non-root",
    }


def _ratios(cases: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    by_key = {(case["code"], case["concurrency"], case["runner"]): case for case in cases}
    ratios: dict[str, dict[str, float]] = {}
    for code_name, concurrency in sorted({(case["code"], case["concurrency"]) for case in cases}):
        entry: dict[str, float] = {}
        for runner, prefix in (("zygote", ""), ("zygote-shared-net", "shared_net_")):
            ours = by_key.get((code_name, concurrency, runner))
            if ours is None:
                continue
            for baseline in ("camel", "fresh"):
                other = by_key.get((code_name, concurrency, baseline))
                if other is None:
                    continue
                entry[f"{prefix}p50_vs_{baseline}"] = round(ours["p50_ms"] / other["p50_ms"], 4)
                entry[f"{prefix}p99_vs_{baseline}"] = round(ours["p99_ms"] / other["p99_ms"], 4)
                entry[f"{prefix}cpu_vs_{baseline}"] = round(
                    ours["cpu_s_per_1000"] / other["cpu_s_per_1000"], 4
                )
        if entry:
            ratios[f"{code_name}@{concurrency}"] = entry
    return ratios


def _targets(cases: list[dict[str, Any]], ratios: dict[str, dict[str, float]]) -> dict[str, Any]:
    targets: dict[str, Any] = {}
    for concurrency in (1, 256):
        trivial = ratios.get(f"trivial@{concurrency}", {}).get("p50_vs_camel")
        sympy = ratios.get(f"sympy@{concurrency}", {}).get("p50_vs_fresh")
        if trivial is not None:
            limit = TARGETS["trivial_p50_vs_camel"]
            targets[f"trivial p50 vs camel @{concurrency}"] = {
                "value": trivial,
                "limit": limit,
                "met": trivial <= limit,
            }
        if sympy is not None:
            limit = TARGETS["sympy_p50_vs_fresh"]
            targets[f"sympy p50 vs fresh @{concurrency}"] = {
                "value": sympy,
                "limit": limit,
                "met": sympy <= limit,
            }
    ours_256 = [case for case in cases if case["runner"] == "zygote" and case["concurrency"] == 256]
    if ours_256:
        limit = TARGETS["lag_256_ms"]
        for label, key in (
            ("max, wall", "lag_max_ms"),
            ("p99, wall", "lag_p99_ms"),
            ("max, loop CPU", "loop_busy_max_ms"),
        ):
            worst = max(case[key] for case in ours_256)
            targets[f"event-loop lag @256 ({label}, ms)"] = {
                "value": worst,
                "limit": limit,
                "met": worst < limit,
            }
    return targets


async def _run(quick: bool) -> dict[str, Any]:
    plan = QUICK_CALLS if quick else FULL_CALLS
    # camel runs `python` from PATH: make it this interpreter, with the same packages.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    cases: list[dict[str, Any]] = []
    config = SandboxConfig(max_concurrency=256)
    shared_net_config = SandboxConfig(max_concurrency=256, network="shared")
    async with Sandbox(config) as sandbox, Sandbox(shared_net_config) as shared_net_sandbox:
        for box in (sandbox, shared_net_sandbox):
            for _ in range(10):
                await box.run(CODES["trivial"])
        # As a rollout process should: long-lived objects out of the collector's way, so that a
        # full collection of the benchmark's own heap does not show up as event-loop lag.
        gc.collect()
        gc.freeze()
        for (code_name, concurrency), counts in plan.items():
            for runner in RUNNERS:
                if runner not in counts:
                    continue
                box = shared_net_sandbox if runner == "zygote-shared-net" else sandbox
                state: dict[str, Any] = {"sandbox": box}
                if runner == "camel":
                    state["executor"] = ThreadPoolExecutor(max_workers=concurrency)
                try:
                    case = await _measure(runner, code_name, concurrency, counts[runner], state)
                finally:
                    if "executor" in state:
                        state["executor"].shutdown(wait=True)
                cases.append(case)
                print(
                    f"  {code_name:8s} c={concurrency:<4d} {runner:17s} p50 {case['p50_ms']:9.2f} ms  "
                    f"p99 {case['p99_ms']:9.2f} ms  cpu {case['cpu_s_per_1000']:8.2f} s/1000  "
                    f"lag max {case['lag_max_ms']:7.2f} ms p99 {case['lag_p99_ms']:6.2f} ms "
                    f"loop busy max {case['loop_busy_max_ms']:6.2f} ms",
                    file=sys.stderr,
                    flush=True,
                )
        capabilities = sandbox.capabilities
    ratios = _ratios(cases)
    return {
        "benchmark": "sandbox",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "machine": _machine(),
        "versions": _versions(),
        "sandbox_config": config.model_dump(mode="json"),
        "capabilities": capabilities,
        "codes": CODES,
        "cases": cases,
        "ratios": ratios,
        "targets": _targets(cases, ratios),
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Run every case side by side; returns the results (also what the JSON file holds)."""
    return asyncio.run(_run(quick))


def render_markdown(results: dict[str, Any]) -> str:
    machine = results["machine"]
    lines = [
        f"### Sandbox ({results['date'][:10]}, {machine['cpus']} CPUs {machine['cpu']}, "
        f"Python {results['versions']['python']}{', quick' if results['quick'] else ''})",
        "",
        "| code | in flight | runner | calls | p50 ms | p99 ms | CPU s / 1000 calls (processes / machine) "
        "| loop lag max / p99 ms | loop busy max ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in results["cases"]:
        lines.append(
            f"| {case['code']} | {case['in_flight']} | {case['runner']} | {case['calls']} | "
            f"{case['p50_ms']:.2f} | {case['p99_ms']:.2f} | "
            f"{case['cpu_s_per_1000']:.2f} / {case['machine_cpu_s_per_1000']:.2f} | "
            f"{case['lag_max_ms']:.2f} / {case['lag_p99_ms']:.2f} | {case['loop_busy_max_ms']:.2f} |"
        )
    lines += ["", "| target | value | limit | met |", "|---|---|---|---|"]
    for name, target in results["targets"].items():
        lines.append(
            f"| {name} | {target['value']:.4g} | {target['limit']:g} | {'yes' if target['met'] else 'no'} |"
        )
    lines += [
        "",
        "zygote = strands_slime.sandbox with its defaults (per-execution network namespace, private /tmp, "
        "own uid); zygote-shared-net = the same with network='shared'; camel = camel-ai SubprocessInterpreter in a thread pool of the same size; fresh = "
        "`python -c` per call via asyncio subprocesses. Loop lag is how late a 1 ms timer fired (wall "
        "clock, includes waiting for a CPU on a saturated machine); loop busy is the CPU the event-loop "
        "thread spent between two ticks, i.e. actual blocking. CPU (processes) counts the benchmark "
        "process and every process it or the zygote started; CPU (machine) is all busy CPU on the machine "
        "during the case, kernel background work (e.g. network-namespace teardown) and other load included.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (under a minute)")
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args()
    results = run(quick=args.quick)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1) + "\n")
    print(render_markdown(results))
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
