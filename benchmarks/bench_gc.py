"""What the cyclic garbage collector pays for live trajectories: arrays (``TokenTrajectory``) vs lists.

    python benchmarks/bench_gc.py                 # 256 and 1,024 live episodes, report as Markdown
    python benchmarks/bench_gc.py --quick         # smoke run (64 and 256 episodes, shorter)
    python benchmarks/bench_gc.py --json

In slime's rollout process about a thousand agent episodes are alive at once, and every full collection
walks every element of every live list. Each measurement runs in a fresh subprocess that builds N
episodes of seeded lengths (2k to 32k tokens, uniform; a 200-1,200-token first prompt, then model
outputs of 50-1,500 tokens and tool results of 20-2,000 tokens in turn, ending on an output), with ids
and logprobs as fresh Python objects as the JSON decoder and the tokenizer hand them over:

* ``arrays``: through the public ``TokenTrajectory`` API (``array('i')``, ``array('b')``,
  ``array('d')``);
* ``lists``: the same data held the old way, three Python lists per episode, built by
  :class:`ListTrajectory` below (the baseline lives in this benchmark: the package has no list form).

Automatic collection is off while building and measuring, so every pause is one we ask for:
``gc.collect()`` (full, repeated), ``gc.collect(1)`` once right after the build (the episodes are still
young, as they are when they start) and repeated once they are old; bytes per token is the growth of
the process's resident memory over the build divided by the tokens held; ``add_output`` is timed
per token (1,000-token outputs with their logprobs) on both layouts.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

VOCAB = 151_643
MIN_TOKENS, MAX_TOKENS = 2_000, 32_000
SEED = 12
OUTPUT_TOKENS_PER_CALL = 1_000
HELD_BYTES_EPISODES = 32
CHILD_TIMEOUT_S = 300


class ListTrajectory:
    """The baseline: ids, mask and logprobs in three lists, filled as ``TokenTrajectory`` did before
    it kept arrays (the same null/NaN handling, the same shared ``0``/``0.0`` for prompt positions)."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.segments: list[tuple[str, int, int]] = []
        self.missing_logprobs = 0

    def add_prompt(self, token_ids: list[int]) -> None:
        """Prompt or tool tokens: mask 0, logprob 0.0."""
        self.segments.append(("prompt", len(self.token_ids), len(token_ids)))
        self.token_ids.extend(token_ids)
        self.loss_mask.extend([0] * len(token_ids))
        self.logprobs.extend([0.0] * len(token_ids))

    def add_output(self, token_ids: list[int], logprobs: list[float | None]) -> None:
        """Model tokens: mask 1, the server's logprobs (null or NaN stored as -inf)."""
        if len(logprobs) != len(token_ids):
            raise ValueError(f"{len(token_ids)} output tokens but {len(logprobs)} logprobs")
        if None not in logprobs and not math.isnan(sum(logprobs)):  # type: ignore[arg-type]
            clean = logprobs
        else:
            clean = []
            for value in logprobs:
                if value is None or math.isnan(value):
                    self.missing_logprobs += 1
                    clean.append(-math.inf)
                else:
                    clean.append(float(value))
        self.segments.append(("output", len(self.token_ids), len(token_ids)))
        self.token_ids.extend(token_ids)
        self.loss_mask.extend([1] * len(token_ids))
        self.logprobs.extend(clean)  # type: ignore[arg-type]


def _new_trajectory(layout: str) -> Any:
    if layout == "lists":
        return ListTrajectory()
    from strands_slime.provider.trajectory import TokenTrajectory

    return TokenTrajectory()


def _segments(rng: Any, total: int) -> list[tuple[bool, int]]:
    """``(is_output, length)`` of one tool episode of ``total`` tokens: the first prompt, then model
    outputs and tool results in turn, ending on an output."""
    prompt = int(rng.integers(200, 1_201))
    segments = [(False, prompt)]
    remaining = total - prompt
    while remaining > 0:
        output = min(remaining, int(rng.integers(50, 1_501)))
        remaining -= output
        if remaining <= 1:  # nothing (or one token) left: this output is the last and takes it
            segments.append((True, output + remaining))
            break
        segments.append((True, output))
        tool = min(remaining - 1, int(rng.integers(20, 2_001)))  # leave the final output a token
        segments.append((False, tool))
        remaining -= tool
    return segments


def build_episodes(layout: str, episodes: int, seed: int) -> tuple[list[Any], int]:
    """``episodes`` trajectories of seeded lengths; returns them and the tokens they hold."""
    import numpy

    rng = numpy.random.default_rng(seed)
    built = []
    tokens = 0
    for _ in range(episodes):
        total = int(rng.integers(MIN_TOKENS, MAX_TOKENS + 1))
        trajectory = _new_trajectory(layout)
        for is_output, length in _segments(rng, total):
            ids = rng.integers(0, VOCAB, size=length).tolist()  # fresh ints, as the JSON decoder gives
            if not is_output:
                trajectory.add_prompt(ids)
            else:
                logprobs = (-rng.exponential(0.3, size=length)).tolist()  # fresh float64 objects
                trajectory.add_output(ids, logprobs)
        tokens += len(trajectory.token_ids)
        built.append(trajectory)
    return built, tokens


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _timed_ms(action: Any) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def _add_output_ns_per_token(layout: str, calls: int) -> float:
    """Median over 5 rounds of the time ``add_output`` takes per token (1,000-token outputs, 16 per
    trajectory, so the stores grow as an episode's do)."""
    import numpy

    rng = numpy.random.default_rng(SEED + 1)
    outputs = [
        (
            rng.integers(0, VOCAB, size=OUTPUT_TOKENS_PER_CALL).tolist(),
            (-rng.exponential(0.3, size=OUTPUT_TOKENS_PER_CALL)).tolist(),
        )
        for _ in range(16)
    ]
    rounds = []
    for _ in range(5):
        elapsed = 0.0
        for _ in range(max(1, calls // 16)):
            trajectory = _new_trajectory(layout)
            trajectory.add_prompt(outputs[0][0])
            started = time.perf_counter()
            for ids, logprobs in outputs:
                trajectory.add_output(ids, logprobs)
            elapsed += time.perf_counter() - started
        rounds.append(elapsed / (max(1, calls // 16) * 16 * OUTPUT_TOKENS_PER_CALL) * 1e9)
    return statistics.median(rounds)


def _collector_edges() -> int:
    """References the collector follows in a full pass: every tracked object's referents."""
    return sum(len(gc.get_referents(tracked)) for tracked in gc.get_objects())


def _held_bytes_per_token(layout: str, episodes: int) -> float:
    """Bytes the trajectories hold per token, by tracemalloc (requested sizes, temporaries freed), over
    the first ``episodes`` episodes of the same seed."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        built, tokens = build_episodes(layout, episodes, SEED)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del built
    return held / tokens


def measure_child(layout: str, episodes: int, repeats: int, add_output_calls: int) -> dict[str, Any]:
    """One layout and size, in this (fresh) process: memory, collector pauses, ``add_output`` cost."""
    import numpy  # noqa: F401  both layouts: the same modules loaded before the floor is measured

    import strands_slime.provider.trajectory  # noqa: F401

    gc.disable()
    gc.collect()
    floor_full_ms = [_timed_ms(gc.collect) for _ in range(repeats)]
    floor_edges = _collector_edges()
    rss_before = _rss_bytes()
    built, tokens = build_episodes(layout, episodes, SEED)
    rss_after = _rss_bytes()
    young_gen1_ms = _timed_ms(lambda: gc.collect(1))
    full_ms = [_timed_ms(gc.collect) for _ in range(repeats)]
    old_gen1_ms = [_timed_ms(lambda: gc.collect(1)) for _ in range(repeats)]
    edges = _collector_edges()
    del built
    gc.collect()
    return {
        "layout": layout,
        "episodes": episodes,
        "tokens": tokens,
        "rss_bytes_per_token": (rss_after - rss_before) / tokens,
        "held_bytes_per_token": _held_bytes_per_token(layout, HELD_BYTES_EPISODES),
        "collector_edges": edges,
        "before_build": {"full_collect_ms": statistics.median(floor_full_ms), "collector_edges": floor_edges},
        "full_collect_ms": {"median": statistics.median(full_ms), "max": max(full_ms), "runs": full_ms},
        "gen1_collect_young_ms": young_gen1_ms,
        "gen1_collect_old_ms": {"median": statistics.median(old_gen1_ms), "max": max(old_gen1_ms)},
        "add_output_ns_per_token": _add_output_ns_per_token(layout, add_output_calls),
    }


def _run_child(layout: str, episodes: int, repeats: int, add_output_calls: int) -> dict[str, Any]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        layout,
        "--episodes",
        str(episodes),
        "--repeats",
        str(repeats),
        "--add-output-calls",
        str(add_output_calls),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{layout} x {episodes} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(quick: bool = False) -> dict[str, Any]:
    """Every size and layout, each in a fresh subprocess; a JSON-ready dict."""
    sizes = (64, 256) if quick else (256, 1024)
    repeats = 3 if quick else 5
    add_output_calls = 160 if quick else 640
    cells: dict[str, dict[str, Any]] = {}
    for episodes in sizes:
        cells[str(episodes)] = {
            layout: _run_child(layout, episodes, repeats, add_output_calls) for layout in ("lists", "arrays")
        }
    return {
        "benchmark": "gc",
        "quick": quick,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "cpus": os.cpu_count(),
            "cpu": _cpu_model(),
        },
        "plan": {
            "tokens_per_episode": [MIN_TOKENS, MAX_TOKENS],
            "seed": SEED,
            "repeats": repeats,
            "add_output_tokens_per_call": OUTPUT_TOKENS_PER_CALL,
            "held_bytes_episodes": HELD_BYTES_EPISODES,
        },
        "cells": cells,
    }


def render_markdown(results: dict[str, Any]) -> str:
    """A Markdown section for docs/benchmarks.md."""
    machine = results["machine"]
    lines = [
        f"{results['date']}, {machine['cpu']}, {machine['cpus']} CPUs, {machine['implementation']} "
        f"{machine['python']}" + (" (quick run)" if results.get("quick") else ""),
        "",
        "| live episodes (tokens) | held as | edges the collector follows | full `gc.collect()`, "
        "median / max | `gc.collect(1)` just built | bytes per token: held / RSS growth | "
        "`add_output` per token |",
        "|---|---|---|---|---|---|---|",
    ]
    for episodes, by_layout in results["cells"].items():
        for layout in ("lists", "arrays"):
            cell = by_layout[layout]
            full = cell["full_collect_ms"]
            name = "three lists (before)" if layout == "lists" else "`TokenTrajectory` arrays"
            lines.append(
                f"| {int(episodes):,} ({cell['tokens'] / 1e6:.1f} M) | {name} | "
                f"{cell['collector_edges'] / 1e6:.2f} M | {full['median']:.1f} / {full['max']:.1f} ms | "
                f"{cell['gen1_collect_young_ms']:.1f} ms | {cell['held_bytes_per_token']:.1f} / "
                f"{cell['rss_bytes_per_token']:.1f} | {cell['add_output_ns_per_token']:.0f} ns |"
            )
    lines.append("")
    for episodes, by_layout in results["cells"].items():
        lists, arrays = by_layout["lists"], by_layout["arrays"]
        full_ratio = lists["full_collect_ms"]["median"] / max(arrays["full_collect_ms"]["median"], 1e-6)
        memory_ratio = lists["held_bytes_per_token"] / max(arrays["held_bytes_per_token"], 1e-6)
        lines.append(
            f"- **{int(episodes):,} live episodes:** a full collection takes "
            f"{lists['full_collect_ms']['median']:.0f} ms over lists and "
            f"{arrays['full_collect_ms']['median']:.1f} ms over arrays ({full_ratio:.0f}x less); the "
            f"trajectories hold {memory_ratio:.1f}x less memory; `add_output` costs "
            f"{arrays['add_output_ns_per_token']:.0f} ns per token (was "
            f"{lists['add_output_ns_per_token']:.0f})."
        )
    plan = results["plan"]
    floor = next(iter(results["cells"].values()))["arrays"]["before_build"]
    lines += [
        "",
        f"Before any episode is built the same process follows {floor['collector_edges'] / 1e6:.2f} M edges "
        f"and a full collection takes {floor['full_collect_ms']:.1f} ms (the interpreter and the imported "
        "modules): with arrays, most of what a full collection costs is no longer the trajectories.",
        "",
        "Each row is one fresh process (`python benchmarks/bench_gc.py`): N episodes of seeded lengths "
        f"({plan['tokens_per_episode'][0]:,} to {plan['tokens_per_episode'][1]:,} tokens, uniform), a "
        "first prompt then model outputs and tool results in turn, ids and logprobs handed over as fresh "
        "Python objects, as the JSON decoder and the tokenizer give them. *Three lists* is the layout "
        "before trajectories kept arrays, rebuilt in the benchmark (`ListTrajectory`) as the baseline. "
        "Automatic collection is off while measuring. *Just built* is the first young collection after "
        "the episodes were created (all of them young then); once they are old a young collection "
        "costs well under 0.1 ms either way. *Held* bytes are tracemalloc's (requested sizes, over the "
        f"first {plan.get('held_bytes_episodes', HELD_BYTES_EPISODES)} episodes), *RSS growth* what the "
        "process grew by over the whole build (allocator slack and the freed temporaries' pages "
        "included). A full collection's cost follows its edges: a list has one per element, each read "
        "from an object of its own, while CPython tracks an `array` only to reach its type, one edge "
        "whatever its length. `add_output` is timed on 1,000-token outputs with their logprobs.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--child``, one measurement) and print the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller, faster run")
    parser.add_argument("--json", action="store_true", help="print the JSON instead of Markdown")
    parser.add_argument("--child", choices=("lists", "arrays"), help=argparse.SUPPRESS)
    parser.add_argument("--episodes", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--add-output-calls", type=int, default=640, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_child(args.child, args.episodes, args.repeats, args.add_output_calls)))
        return 0
    results = run(quick=args.quick)
    print(json.dumps(results, indent=1) if args.json else render_markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
