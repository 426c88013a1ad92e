"""Reward cost: µs per sample on the string/number path, math-verify latency, and event-loop lag.

    python benchmarks/bench_reward.py [--quick]    # writes benchmarks/results/reward.json

``run(quick=False) -> dict`` and ``render_markdown(results) -> str`` are what docs/benchmarks.md uses.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from strands_slime.episode_metadata import EpisodeMetadata  # noqa: E402
from strands_slime.reward.dapo import RewardConfig, reward_func  # noqa: E402
from strands_slime.reward.math_answer import MathVerifier, check_answer, math_verify_available  # noqa: E402
from strands_slime.reward.math_answer.normalize import (  # noqa: E402
    _normalize_cached,
    _normalize_label_cached,
    _parse_number_cached,
)

RESULTS_PATH = REPO_ROOT / "benchmarks" / "results" / "reward.json"

# A realistic final assistant message: reasoning, a tool-informed explanation, the answer line.
_REASONING = (
    "<think>\n" + "Let me check the divisors and recount the cases carefully. " * 40 + "\n</think>\n\n"
)
_BODY = "Using the Python result, the count of valid pairs is 34, which matches the case analysis.\n\n"


def _case(answer_line: str, label: str) -> tuple[str, str]:
    return _REASONING + _BODY + answer_line, label


# Each case is built from a number i: "distinct" runs use a new i per call (nothing cached).
CASES = {
    "correct (Answer: \\boxed{34})": lambda i: _case(f"Answer: \\boxed{{{i}}}", str(i)),
    "wrong number (Answer: 35)": lambda i: _case(f"Answer: {i + 1}", str(i)),
    "no answer": lambda i: _case("I could not finish the computation.", str(i)),
    "fraction vs decimal": lambda i: _case(f"Answer: \\frac{{{i}}}{{2}}", str(i / 2)),
}
FINAL_TEXTS = [CASES[name](34)[0] for name in CASES]


def _per_call_us(function: Any, calls: int, repeats: int, before_batch: Any = None) -> dict[str, float]:
    """Median and best of ``repeats`` batches of ``calls`` calls, in µs per call."""
    batches = []
    for _ in range(repeats):
        if before_batch is not None:
            before_batch()
        started = time.perf_counter()
        for index in range(calls):
            function(index)
        batches.append((time.perf_counter() - started) / calls * 1e6)
    return {"median_us": statistics.median(batches), "best_us": min(batches)}


def _clear_caches() -> None:
    for cached in (_normalize_cached, _normalize_label_cached, _parse_number_cached):
        cached.cache_clear()


def bench_string_path(quick: bool) -> dict[str, Any]:
    """``check_answer`` without math-verify: a repeated answer (as in a GRPO group) and distinct ones."""
    calls, repeats = (300, 5) if quick else (3000, 9)
    results = {}
    for name, build in CASES.items():
        text, label = build(34)
        distinct = [build(1000 + index) for index in range(calls)]
        results[name] = {
            "repeated_us": _per_call_us(
                lambda _, text=text, label=label: check_answer(text, label), calls, repeats
            )["median_us"],
            "distinct_us": _per_call_us(
                lambda index, distinct=distinct: check_answer(*distinct[index]),
                calls,
                repeats,
                before_batch=_clear_caches,
            )["median_us"],
        }
    return {"calls_per_batch": calls, "batches": repeats, "cases": results}


def _sample(final_text: str, label: str = "34") -> SimpleNamespace:
    return SimpleNamespace(
        label=label,
        response="",
        metadata=EpisodeMetadata(final_text=final_text, tool_iterations=3).to_metadata(),
    )


async def _bench_reward_func(quick: bool) -> dict[str, Any]:
    """The whole slime entry point (text selection, checks, shaping, metadata) on lists of samples."""
    config = RewardConfig()  # defaults: math-verify on, but these answers never need it
    size, repeats = (500, 5) if quick else (4000, 7)
    texts = FINAL_TEXTS
    batches = []
    for _ in range(repeats):
        samples = [_sample(texts[i % len(texts)]) for i in range(size)]
        started = time.perf_counter()
        await reward_func(None, samples, config=config)
        batches.append((time.perf_counter() - started) / size * 1e6)
    return {"samples_per_batch": size, "batches": repeats, "median_us": statistics.median(batches)}


async def _loop_lag_during(work: Any) -> tuple[Any, float]:
    """Run ``work`` while a 1 ms ticker measures the worst extra delay of the event loop."""
    worst = 0.0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        while not stop.is_set():
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - started - 0.001)

    ticking = asyncio.create_task(ticker())
    try:
        result = await work
    finally:
        stop.set()
        await ticking
    return result, worst * 1e3


async def _bench_math_verify(quick: bool) -> dict[str, Any]:
    if not math_verify_available():
        return {"available": False}
    verifier = MathVerifier(timeout_s=2.0, workers=1)
    try:
        started = time.perf_counter()
        assert verifier.warm_up()
        cold_start_s = time.perf_counter() - started

        count = 40 if quick else 300
        latencies = []
        for n in range(count):  # distinct pairs: never served from the cache
            started = time.perf_counter()
            await verifier.verify(str(n + 2), f"\\sqrt{{{(n + 2) ** 2}}}")
            latencies.append((time.perf_counter() - started) * 1e3)
        cached = _per_call_us(lambda _: verifier.verify_blocking("2", "\\sqrt{4}"), 200 if quick else 2000, 5)

        # A burst of rewards that all need math-verify, as in a GRPO step with unusual answers.
        config = RewardConfig(shaping="none", math_verify_timeout_s=2.0, math_verify_workers=1)
        burst = 50 if quick else 200
        samples = [_sample(f"Answer: \\sqrt{{{(n + 1000) ** 2}}}", label=str(n + 1000)) for n in range(burst)]
        started = time.perf_counter()
        rewards, lag_ms = await _loop_lag_during(reward_func(None, samples, config=config))
        burst_s = time.perf_counter() - started
        assert rewards == [1.0] * burst

        started = time.perf_counter()
        outcome = await verifier.verify("34", "10^{10^{10}}")
        timeout_s = time.perf_counter() - started
        started = time.perf_counter()
        await verifier.verify("99999", "\\sqrt{9999800001}")  # not cached
        restart_s = time.perf_counter() - started
        return {
            "available": True,
            "cold_start_s": cold_start_s,
            "uncached_check_ms": {
                "median": statistics.median(latencies),
                "p90": statistics.quantiles(latencies, n=10)[-1],
                "max": max(latencies),
                "count": count,
            },
            "cached_check_us": cached["median_us"],
            "burst": {"samples": burst, "seconds": burst_s, "max_event_loop_lag_ms": lag_ms},
            "hung_expression": {"outcome": outcome, "returned_after_s": timeout_s, "next_check_s": restart_s},
        }
    finally:
        verifier.close()


def run(quick: bool = False) -> dict[str, Any]:
    """All measurements as a JSON-ready dict."""

    async def measure() -> dict[str, Any]:
        return {
            "reward_func_string_path": await _bench_reward_func(quick),
            "math_verify": await _bench_math_verify(quick),
        }

    measured = asyncio.run(measure())
    return {
        "benchmark": "reward",
        "quick": quick,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
        "check_answer_string_path": bench_string_path(quick),
        **measured,
    }


def render_markdown(results: dict[str, Any]) -> str:
    """A Markdown section for docs/benchmarks.md."""
    machine = results["machine"]
    lines = [
        "### Reward (`strands_slime.reward_func`)",
        "",
        f"{results['date']}, {machine['cpus']} CPUs, Python {machine['python']}"
        + (" (quick run)" if results.get("quick") else ""),
        "",
        "| string/number path, ~2.5k-char final text | µs/sample, repeated answer | µs/sample, distinct answers |",
        "|---|---|---|",
    ]
    for name, timing in results["check_answer_string_path"]["cases"].items():
        lines.append(
            f"| `check_answer`: {name} | {timing['repeated_us']:.1f} | {timing['distinct_us']:.1f} |"
        )
    whole = results["reward_func_string_path"]
    lines += [
        f"| whole `reward_func` on a list of {whole['samples_per_batch']} samples (4 kinds mixed) | "
        f"{whole['median_us']:.1f} | |",
        "",
    ]
    verify = results["math_verify"]
    if not verify.get("available"):
        lines.append("math-verify not installed: only the string/number path runs.")
        return "\n".join(lines)
    uncached = verify["uncached_check_ms"]
    burst = verify["burst"]
    hung = verify["hung_expression"]
    lines += [
        "| math-verify path (worker process, hard deadline 2 s) | value |",
        "|---|---|",
        f"| worker cold start | {verify['cold_start_s']:.2f} s |",
        f"| uncached check, median / p90 / max | {uncached['median']:.2f} / {uncached['p90']:.2f} / "
        f"{uncached['max']:.2f} ms |",
        f"| cached check | {verify['cached_check_us']:.1f} µs |",
        f"| burst of {burst['samples']} rewards needing math-verify | {burst['seconds']:.2f} s, "
        f"worst event-loop lag {burst['max_event_loop_lag_ms']:.1f} ms |",
        f"| hung expression `10^{{10^{{10}}}}` | `{hung['outcome']}` after {hung['returned_after_s']:.2f} s; "
        f"next check (fresh worker) {hung['next_check_s']:.2f} s |",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (CI smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    args = parser.parse_args()
    results = run(quick=args.quick)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(render_markdown(results))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
