"""Run every benchmark and write docs/benchmarks.md and docs/benchmarks-concurrency.png.

    python benchmarks/run_all.py              # full run (make bench): ~16 min on 2 cores (provider ~12)
    python benchmarks/run_all.py --quick      # smoke run (< 2 min per benchmark); docs untouched
    python benchmarks/run_all.py --only provider,reward
    python benchmarks/run_all.py --render-only   # rebuild the doc from benchmarks/results/*.json

Each benchmark module exposes ``run(quick) -> dict`` and ``render_markdown(results) -> str``; full
results go to ``benchmarks/results/<name>.json`` (quick ones to ``<name>-quick.json``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for path in (str(REPO_ROOT), str(BENCH_DIR)):
    if path not in sys.path:
        sys.path.insert(0, path)

RESULTS_DIR = BENCH_DIR / "results"
DOC_PATH = REPO_ROOT / "docs" / "benchmarks.md"
PLOT_PATH = REPO_ROOT / "docs" / "benchmarks-concurrency.png"
BENCHMARKS = {
    "provider": ("bench_provider", "Provider: strands_slime vs strands-sglang"),
    "sandbox": ("bench_sandbox", "Sandbox"),
    "reward": ("bench_reward", "Reward"),
    "gc": ("bench_gc", "Garbage collector: live trajectories in arrays vs lists"),
}


def results_path(name: str, quick: bool) -> Path:
    return RESULTS_DIR / (f"{name}-quick.json" if quick else f"{name}.json")


def run_benchmark(name: str, quick: bool) -> dict[str, Any] | None:
    """Run one benchmark module; a missing module or a failure is reported, not fatal."""
    module_name, _title = BENCHMARKS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        print(f"[{name}] skipped: cannot import benchmarks/{module_name}.py ({exc})", file=sys.stderr)
        return None
    print(f"[{name}] running{' (quick)' if quick else ''} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        results = module.run(quick=quick)
    except Exception:
        print(f"[{name}] FAILED:\n{traceback.format_exc()}", file=sys.stderr)
        return None
    out = results_path(name, quick)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"[{name}] done in {time.perf_counter() - started:.0f} s -> {out}", file=sys.stderr, flush=True)
    return results


def load_saved(name: str, quick: bool) -> dict[str, Any] | None:
    path = results_path(name, quick)
    return json.loads(path.read_text()) if path.exists() else None


# --------------------------------------------------------------------------- the document


def _machine_section(results: dict[str, dict[str, Any]]) -> list[str]:
    provider = results.get("provider")
    source = provider or next(iter(results.values()))
    machine = source.get("machine", {})
    lines = [
        "## Machine and versions",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {machine.get('cpu', '?')}, {machine.get('cpus', '?')} CPUs |",
    ]
    ram = machine.get("ram_gb") or machine.get("memory_gb")
    if ram:
        lines.append(f"| RAM | {ram} GB |")
    lines.append(f"| OS | {machine.get('platform', '?')} |")
    for name, result in results.items():
        lines.append(f"| {name} benchmark run | {result.get('date', '?')} |")
    if provider:
        for package, version in provider.get("versions", {}).items():
            lines.append(f"| provider driver: {package} | {version or 'not installed'} |")
    for name in ("sandbox", "reward", "gc"):
        other = results.get(name)
        if other and other.get("versions"):
            described = ", ".join(f"{k} {v}" for k, v in other["versions"].items())
            lines.append(f"| {name} benchmark: versions | {described} |")
        elif other and other.get("machine", {}).get("python"):
            lines.append(f"| {name} benchmark: Python | {other['machine']['python']} |")
    return lines


def cells_turns(results: dict[str, Any], concurrency: str) -> float | None:
    """Ours' end-to-end turns/s over the peer's at one concurrency."""
    cells = results["sweep"].get(concurrency, {})
    ours = cells.get("ours", {}).get("turns_per_s")
    peer = cells.get("peer", {}).get("turns_per_s")
    return ours / peer if ours and peer else None


def provider_findings(results: dict[str, Any]) -> list[str]:
    """Plain-language reading of the provider numbers: ratios, and what bounds ours."""
    sweep = results["sweep"]
    lines = ["### Reading the provider numbers", ""]
    rows = []
    for concurrency, cells in sweep.items():
        ours = cells["ours"]["cpu_ms_per_turn"]
        floor = cells["floor"]["cpu_ms_per_turn"]
        peer = cells.get("peer", {}).get("cpu_ms_per_turn")
        if not ours or not floor:
            continue
        rows.append((concurrency, ours, peer, floor))
    if not rows:
        return []
    for concurrency, ours, peer, floor in rows:
        share = floor / ours * 100
        plural = "" if concurrency == "1" else "s"
        text = f"- **{concurrency} concurrent episode{plural}:** ours {ours:.2f} ms CPU per turn"
        if peer:
            paired = (results.get("paired_ratios") or {}).get(concurrency) or {}
            total = paired.get("total") or peer / ours
            above = paired.get("above_floor") or (peer - floor) / max(ours - floor, 1e-9)
            text += (
                f", the peer {peer:.2f} ms: **{total:.2f}x** in total, **{above:.2f}x** on what the "
                f"provider adds above Strands' own {floor:.2f} ms"
            )
        turns = cells_turns(results, concurrency)
        if turns:
            text += f"; {turns:.2f}x the peer's turns per second"
        text += f". Strands' agent loop alone is {share:.0f} % of ours."
        lines.append(text)
    lines += [
        "",
        "Ours is not 2x cheaper than the peer *in total* at 64 and 256 concurrent episodes because much "
        "of every turn is not the provider's: Strands' agent loop (the floor: a deep copy of the history "
        "on every model call, stream events, hooks, spans; ours also turns off Strands' serialization of "
        "the history for cycle spans that do not record, which the floor still pays), and, for "
        "any token-in/token-out provider, tokenizing the tool output (~0.7 µs per token with Hugging Face "
        "tokenizers' fastest entry point, ~0.7 ms per turn at these sizes) and one aiohttp round trip. "
        "The cyclic garbage collector walking every live episode's token lists weighs on the peer (its "
        "share grows with concurrency); ours runs with the GC settings its rollout applies by default.",
        "",
    ]
    bounds = results.get("bounds") or {}
    concurrency = str((results.get("plan") or {}).get("bounds", {}).get("concurrency"))
    plain = sweep.get(concurrency, {})
    names = {"strands_patches": "the Strands patches", "gc_tuned": "GC tuned"}
    alone = bounds.get("without_strands", {})
    if alone.get("ours", {}).get("cpu_ms_per_turn"):
        ours_alone = alone["ours"]["cpu_ms_per_turn"]
        text = (
            f"- **Provider alone** (its `stream()` driven directly, no Strands) at {concurrency} concurrent "
            f"episodes: ours {ours_alone:.2f} ms per turn"
        )
        peer_alone = alone.get("peer", {}).get("cpu_ms_per_turn")
        if peer_alone:
            text += f", the peer {peer_alone:.2f} ms: **{peer_alone / ours_alone:.2f}x**"
        lines.append(text + ".")
        ours_in_strands = plain.get("ours", {}).get("cpu_ms_per_turn")
        floor_ms = plain.get("floor", {}).get("cpu_ms_per_turn")
        if ours_in_strands and floor_ms and ours_in_strands - ours_alone > floor_ms:
            lines.append(
                f"- Inside Strands ours costs {ours_in_strands - ours_alone:.2f} ms per turn more than alone, "
                f"while the floor is {floor_ms:.2f} ms: the scripted floor understates what Strands costs "
                "around a real provider (messages with reasoning blocks, more stream events, more live "
                "objects for the collector to walk)."
            )
    for variant, cells in bounds.items():
        if variant not in names:
            continue
        ours_before = plain.get("ours", {}).get("cpu_ms_per_turn")
        ours_after = cells.get("ours", {}).get("cpu_ms_per_turn")
        if not ours_before or not ours_after:
            continue
        text = (
            f"- With {names.get(variant, variant)} at {concurrency} concurrent episodes: ours "
            f"{ours_before:.2f} → {ours_after:.2f} ms per turn"
        )
        peer_before = plain.get("peer", {}).get("cpu_ms_per_turn")
        peer_after = cells.get("peer", {}).get("cpu_ms_per_turn")
        if peer_before and peer_after:
            text += f", the peer {peer_before:.2f} → {peer_after:.2f} ms (peer/ours {peer_after / ours_after:.2f}x)"
        floor_after = cells.get("floor", {}).get("cpu_ms_per_turn")
        if floor_after:
            text += f", the floor {plain['floor']['cpu_ms_per_turn']:.2f} → {floor_after:.2f} ms"
        lines.append(text + ".")
    return lines


def render_document(results: dict[str, dict[str, Any]], plot_written: bool) -> str:
    generated = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `make bench` (`python benchmarks/run_all.py`) on {generated}. "
        "`python benchmarks/run_all.py --quick` is a smoke run that leaves this file alone; "
        "`--render-only` rebuilds it from `benchmarks/results/*.json`. The machine's speed drifts by "
        "about ±15 % over minutes, so only paired, interleaved runs are compared.",
        "",
        *_machine_section(results),
        "",
    ]
    provider = results.get("provider")
    if provider:
        import bench_provider

        lines += ["## Provider", ""]
        paths = provider if provider.get("paths") else load_saved("provider-paths", False)
        if paths:  # the figure to trust: both paths, both methods (bench_provider.py --paths)
            lines += [bench_provider.paths_section(paths), ""]
        lines += [bench_provider.render_markdown(provider), ""]
        if plot_written:
            lines += [f"![concurrency sweep]({PLOT_PATH.name})", ""]
        lines += [*provider_findings(provider), "", PROVIDER_PROFILE, "", PROVIDER_METHOD, ""]
    for name in ("sandbox", "reward", "gc"):
        if name in results:
            module = importlib.import_module(BENCHMARKS[name][0])
            lines += [f"## {BENCHMARKS[name][1]}", "", module.render_markdown(results[name]), ""]
    return "\n".join(lines).rstrip() + "\n"


PROVIDER_PROFILE = """### Where the CPU goes (profile of 2026-11-23, 22:50)

py-spy (`record --native -r 200`, attached for 20 s of the measured phase only) on the driver of ours
at 64 concurrent episodes, the code of this run: shares of the driver's non-idle samples, each sample
counted once, by the innermost frame that names a part (a collector pass or a tokenizer call counts
as such wherever it runs). Re-measure by starting the driver with `--wait-for-start --run-for 25`,
attaching `py-spy record --native -f raw --pid PID --duration 20` once it prints `ready`, then writing
the start time to its stdin.

| share of samples (ours, in Strands, as shipped) | share |
|---|---|
| Strands: agent loop, stream events, hooks, tool executor, ids (its native calls included) | 29 % |
| the provider's own Python (prompt delta, reply parsing, trajectory, events) | 15 % |
| Hugging Face tokenizers (native; ~1,070 tool-output tokens per turn, mostly in the worker thread) | 12 % |
| asyncio (tasks, the loop, the hand-off to the tokenizer thread) | 9 % |
| aiohttp | 9 % |
| chat template (jinja2 sandbox) | 7 % |
| Strands' deep copy of the history (the middleware context, every model call) | 6 % |
| cyclic garbage collector | 4 % |
| JSON (orjson for `/generate`; Strands parsing tool input) | 3 % |
| Strands' tracer: spans (no message serialization left when no span records) | 3 % |
| benchmark driver (tool, ticker) | 3 % |

Done for issue 17 (earlier runs): the provider registers an `InvokeModelStage.Input` middleware
(public Strands API) that hands each call only the messages after its last output, so Strands no
longer normalizes (a second deep copy) and serializes the whole history for the model-call span (left
whole when a span records); the Jinja sandbox's attribute check is decided once per builtin type and
name (a render ~18 % cheaper, same sandbox, same output); outputs of up to 2,048 tokens are decoded on
the loop instead of in the tokenizer thread; orjson for the `/generate` JSON; no prompt id list kept
alive during a request; trajectories keep ids, mask and logprobs in `array`s and the request's ids
are encoded from the array's buffer (RSS per in-flight episode 208 → 129 KB at 64 episodes).

Done in this run, each measured side by side against the peer at 64 concurrent episodes (median of 3):

- **Strands' cycle-span serialization skipped when the span does not record**
  (`strands_slime/provider/telemetry.py`): Strands' tracer mapped and JSON-serialized the whole
  history on every cycle for a span OpenTelemetry then dropped (8 % of the samples in the earlier
  profile). The provider wraps that one tracer method once per process so that it returns at once for
  a span that does not record and does all it did for one that does (traces are unchanged; tested
  with a recording OpenTelemetry SDK). ours/peer 0.65 → 0.62.
- **A `/generate` reply is decoded and parsed with collections deferred, and its per-token logprob
  lists are not kept** in `meta_info` (their ids and logprobs are the response's fields): a young
  collection triggered by the decoder's hundreds of small lists walked them and everything else young.
  GC share of ours' CPU 7.1 → 4.8 %; ours/peer 0.62 → 0.60.
- **The comparison itself is now side by side**: both drivers at once in the same window (the table
  above). Run back to back, one process's CPU per turn moved by up to ±20 % between runs on this
  shared machine (the server's own CPU per turn for identical work moved as much), so the sweep's
  back-to-back ratios for the same code ranged 0.51-0.90; side by side the three repeats of a cell
  agree within ±3 %. The earlier reported 0.58 / 0.65 were back-to-back medians.

Tried and left out: a young-generation threshold of 6,000 (GC share 4.8 → 2.5 %, ours/peer 0.60 →
0.58) makes gen-1 pauses of 70 ms at 1,024 episodes in flight, over issue 12's 50 ms; the runtime's
young collection every 32 handled replies, which that goal needs (docs/soak.md), costs about 2 %
here (0.58 without it in one side-by-side run of 3).

**The goal (ours/peer ≤ 0.5 at 64 and 256 side by side) is not met** (table above). ours/peer =
(S + O) / (S + P) with S what Strands costs around a real provider, O ours alone and P the peer alone
(the *provider alone* rows). 0.5 needs O ≤ (P − S) / 2. What is left of ours is spread thin: a
tokenizer every token-in/token-out provider pays, aiohttp's request path, a sandboxed Jinja render,
asyncio. What would get there: Strands not deep-copying the history on every model call (an upstream
change: the copy is made before any middleware runs); tokenizing tool outputs outside the rollout
process (the multi-process executor spreads it over cores, it does not remove it); running the agent
loop without Strands (*provider alone*); or giving back the GC settings' pause bounds.

Left as they are, on purpose: substituting tool outputs into a pre-rendered template shape (exact only
if the template never looks at the content, which cannot be checked); emitting fewer stream events
(Strands treats `contentBlockStart` of text as optional, but callback handlers may count on it);
tokenizing texts over 2 KB on the event loop (saves the thread hand-off on one core, but on the
many-core machines slime runs on the thread tokenizes in parallel with the loop); an unsandboxed Jinja
environment (chat templates come with checkpoints)."""


PROVIDER_METHOD = """### How the provider benchmark works

- **Same work.** `benchmarks/transcripts.py` builds seeded episodes: a DAPO-style problem, 1 to 8
  tool-calling turns (15 % of them with two parallel calls) with `<think>` reasoning of 40 to 400
  words, then a boxed answer. Tool outputs are printed-Python-like text of exactly 100 to 4,000 Qwen3
  tokens (log-uniform, at most 24k per episode). The dev server replays the replies; the Strands tool
  returns the output keyed by the code the model sent. Both providers get the bundled Qwen3
  tokenizer, the hermes parser, `max_new_tokens=4096`, and
  `Agent(callback_handler=None, conversation_manager=NullConversationManager(), retry_strategy=None)`.
  The audit checks that both send identical `input_ids`, request by request.
- **Same interpreter.** strands-sglang 0.6.2 needs Python 3.12, so `make bench` creates `.venv-peer`
  (Python 3.12, strands-agents 1.62.0, strands-sglang 0.6.2, this repo installed editable, no
  torch) and both providers' drivers run there. orjson is installed there too, as in slime's image
  (SGLang depends on it): ours uses it for the `/generate` JSON when present, the peer's code does not.
- **Only client cost.** The scripted dev server (`--latency 0`) runs in its own process, pinned to
  CPU 0; each driver is pinned to CPU 1. CPU per turn is the driver's process CPU time (all threads,
  so offloaded tokenization counts) over model calls, minus the idle cost of the 1 ms lag ticker
  (calibrated per run). The server's CPU per turn is reported separately.
- **Strands floor.** The same agent loop with an in-process scripted Strands model: no HTTP, no
  tokenizer. It is what any provider pays for Strands itself.
- **Concurrency.** N worker tasks each run episodes back to back, so N are in flight until the last
  ones; each (provider, concurrency) run is one fresh process with 8 warm-up episodes first.
- **Loop lag** is how late a 1 ms `asyncio.sleep` wakes up. Under the zero-latency load the driver's
  core is saturated, so lag there mostly measures queueing; the separate run with server latency
  shows blocking where the CPU has headroom (the peer tokenizes and templates on the loop).
- **RSS per in-flight episode** is (peak RSS during the run − RSS after warm-up) / N; at N=1 it is
  allocator noise.
- **Input-logprob tokens** come from the server's request log: per request, `len(input_ids) −
  logprob_start_len` when `return_logprob` is true and `logprob_start_len` is sent. The peer asks for
  prompt logprobs from its last turn onwards (from 0 on turn 1), which also caps SGLang's prefix-cache
  reuse at that position; ours omits it and gets output logprobs only."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; writes *-quick.json, not the doc")
    parser.add_argument("--only", help="comma-separated subset of: " + ", ".join(BENCHMARKS))
    parser.add_argument("--render-only", action="store_true", help="rebuild the doc from saved results")
    parser.add_argument(
        "--doc", type=Path, help="write the document here (default: docs/benchmarks.md, full runs)"
    )
    args = parser.parse_args(argv)
    names = list(BENCHMARKS)
    if args.only:
        names = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = sorted(set(names) - set(BENCHMARKS))
        if unknown:
            parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")

    results: dict[str, dict[str, Any]] = {}
    for name in names:
        result = load_saved(name, args.quick) if args.render_only else run_benchmark(name, args.quick)
        if result is not None:
            results[name] = result
    if not args.render_only and not args.quick:
        # A partial run keeps the other sections from their saved results.
        for name in BENCHMARKS:
            if name not in results and (saved := load_saved(name, False)) is not None:
                results[name] = saved
    if not results:
        print("no benchmark results to report", file=sys.stderr)
        return 1

    doc = args.doc or (None if args.quick else DOC_PATH)
    plot_written = False
    if "provider" in results and doc is not None:
        import plot

        try:
            plot.plot_sweep(results["provider"], doc.parent / PLOT_PATH.name)
            plot_written = True
        except (ImportError, ValueError) as exc:
            print(f"[plot] skipped: {exc}", file=sys.stderr)
    text = render_document({k: results[k] for k in BENCHMARKS if k in results}, plot_written)
    if doc is None:
        print(text)
    else:
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(text)
        print(f"wrote {doc}", file=sys.stderr)
    failed = [name for name in names if name not in results]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
