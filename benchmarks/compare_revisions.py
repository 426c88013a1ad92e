"""CPU per agent turn of this checkout against another revision, side by side in one window.

``python benchmarks/compare_revisions.py --base <rev>`` checks ``<rev>`` out into a temporary git
worktree and runs the provider benchmark's driver (``provider_driver.py --provider ours``, the plain
provider path: a fresh ``Agent`` and ``SGLangModel`` per episode on one shared client, four tool calls
per episode) of both checkouts at the same time, each against its own dev server, both drivers on one
CPU and both servers on the other (``bench_provider.run_side_by_side``): a change in the machine's
speed moves both alike. The start order is swapped every repeat. Each revision runs its own driver, so
the comparison is of what a user of each revision gets. ``--gc`` runs both with the rollout's GC tuning
(the ``generate`` path's settings); by default the plain-provider path, as a user writes it.

Writes ``benchmarks/results/revisions.json`` and, with ``--write-doc``, the "Before and after"
section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_provider
import transcripts as transcript_data

REPO_ROOT = bench_provider.REPO_ROOT
RESULTS_PATH = REPO_ROOT / "benchmarks" / "results" / "revisions.json"
DOC_PATH = REPO_ROOT / "docs" / "benchmarks.md"


def _markers(gc: bool, setup: str | None = None) -> tuple[str, str]:
    """The docs markers of one mode's section (plain provider path, generate's GC settings, or one
    ``--setup`` of this checkout's driver over both packages)."""
    mode = f"setup-{setup}" if setup else "generate-gc" if gc else "plain"
    return f"<!-- compare-revisions {mode}: begin -->", f"<!-- compare-revisions {mode}: end -->"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def compare(
    base: str,
    concurrencies: list[int],
    repeats: int,
    run_for_s: float,
    settle_s: float,
    gc: bool,
    setup: str | None = None,
) -> dict[str, Any]:
    """Both revisions side by side at each concurrency, ``repeats`` times; the medians and ratios.
    With ``setup`` (``readme`` or ``bare``: ``provider_driver.py --ours-setup``) both run this
    checkout's driver over their own package, so the same harness and options measure both codes."""
    base_commit = _git("rev-parse", base)
    head_commit = _git("rev-parse", "HEAD")
    worktree = Path(tempfile.mkdtemp(prefix="compare-revisions-")) / "base"
    _git("worktree", "add", "--detach", str(worktree), base_commit)
    work = Path(tempfile.mkdtemp(prefix="compare-revisions-data-"))
    labels = {"ours@base": worktree}
    options: dict[str, dict[str, Any]] = {label: {"rollout_gc": gc} for label in ("ours@base", "ours")}
    if setup is not None:
        for label in options:
            options[label]["ours_setup"] = setup
    cells: dict[str, Any] = {}
    try:
        from strands_slime.provider.tokenizer import load_tokenizer

        data = transcript_data.build_transcripts(32, load_tokenizer(), seed=bench_provider.SEED)
        transcripts_file, script_file = work / "transcripts.json", work / "script.json"
        transcript_data.save(data, transcripts_file)
        script_file.write_text(json.dumps(transcript_data.dev_server_script(data)))
        for concurrency in concurrencies:
            runs = []
            for repeat in range(repeats):
                order = ["ours@base", "ours"] if repeat % 2 == 0 else ["ours", "ours@base"]
                result = bench_provider.run_side_by_side(
                    Path(sys.executable),
                    order,
                    script_file,
                    transcripts_file,
                    concurrency,
                    run_for_s=run_for_s,
                    settle_s=settle_s,
                    options=options,
                    checkouts=labels if setup is None else None,
                    packages=labels if setup is not None else None,
                )
                before = result["providers"]["ours@base"]["cpu_ms_per_turn"]
                after = result["providers"]["ours"]["cpu_ms_per_turn"]
                runs.append(
                    {
                        "before_ms": before,
                        "after_ms": after,
                        "ratio": after / before if before and after else None,
                    }
                )
                print(
                    f"  x{concurrency:<5} before {before:.2f} ms  after {after:.2f} ms  after/before {after / before:.3f}",
                    flush=True,
                )
            ratios = [r["ratio"] for r in runs if r["ratio"] is not None]
            cells[str(concurrency)] = {
                "runs": runs,
                "before_ms": statistics.median(r["before_ms"] for r in runs),
                "after_ms": statistics.median(r["after_ms"] for r in runs),
                "after_over_before": statistics.median(ratios) if ratios else None,
                "after_over_before_all": ratios,
            }
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO_ROOT, check=False)
        shutil.rmtree(worktree.parent, ignore_errors=True)  # the temporary folder that held the worktree
        shutil.rmtree(work, ignore_errors=True)
    return {
        "benchmark": "compare_revisions",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": bench_provider.machine_info(),
        "base": {"rev": base, "commit": base_commit},
        "head": {"commit": head_commit},
        "gc": gc,
        "setup": setup,
        "path": _path_name(gc, setup),
        "window_s": [settle_s, run_for_s],
        "repeats": repeats,
        "load_average": round(os.getloadavg()[0], 1),
        "cells": cells,
    }


def _path_name(gc: bool, setup: str | None) -> str:
    if setup == "bare":
        return "plain provider as written bare (`Agent(model=SGLangModel(...))`, no plugin, no settings), this checkout's driver over both packages"
    if setup == "readme":
        return "plain provider as the README writes it (`rollout_settings()` wired, the model's plugin), this checkout's driver over both packages"
    if gc:
        return "each revision's own driver, with generate's GC settings (decode scope, pace, tuned collector)"
    return "each revision's own driver, the plain provider path (Agent + SGLangModel + plugin per episode)"


def render_markdown(results: dict[str, Any]) -> str:
    """The docs section for ``results``."""
    machine = results["machine"]
    begin, end = _markers(results["gc"], results.get("setup"))
    lines = [
        begin,
        f"### Before and after: {results['path']}",
        "",
        f"`python benchmarks/compare_revisions.py --base {results['base']['rev']}"
        + (" --gc" if results["gc"] else "")
        + (f" --setup {results['setup']}" if results.get("setup") else "")
        + f"` on {results['date']} "
        f"({machine.get('cpu', '?')}, {machine.get('cpus', '?')} CPUs, load {results.get('load_average', '?')}): base "
        f"`{results['base']['commit'][:8]}`, head `{results['head']['commit'][:8]}`; {results['path']}; both "
        f"drivers at once on one CPU, each with its own dev server on the other, CPU per turn over "
        f"the window {results['window_s'][0]:g}-{results['window_s'][1]:g} s of each run, "
        f"{results['repeats']} repeats with the start order swapped.",
        "",
        "| concurrent episodes | before ms/turn | after ms/turn | after/before (median) | every repeat |",
        "|---|---|---|---|---|",
    ]
    for concurrency, cell in results["cells"].items():
        every = ", ".join(f"{r:.3f}" for r in cell["after_over_before_all"])
        lines.append(
            f"| {concurrency} | {cell['before_ms']:.2f} | {cell['after_ms']:.2f} | "
            f"{cell['after_over_before']:.3f} | {every} |"
        )
    lines += ["", end]
    return "\n".join(lines)


def write_doc(results: dict[str, Any]) -> None:
    """Replace (or append) the section between the markers in docs/benchmarks.md."""
    begin, end = _markers(results["gc"], results.get("setup"))
    bench_provider.replace_doc_section(DOC_PATH, begin, end, render_markdown(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base", required=True, help="the revision to compare against (a commit, branch or tag)"
    )
    parser.add_argument("--concurrency", default="64,256", help="comma-separated concurrent episodes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run-for", type=float, default=30.0, help="seconds each driver runs")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds before the measured window")
    parser.add_argument("--gc", action="store_true", help="both with the rollout's GC tuning")
    parser.add_argument(
        "--setup",
        choices=("readme", "bare"),
        help="run this checkout's driver over both packages with --ours-setup SETUP (bare works on any "
        "revision; readme needs rollout_settings in the base)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    parser.add_argument("--write-doc", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    results = compare(
        args.base,
        [int(c) for c in args.concurrency.split(",")],
        args.repeats,
        args.run_for,
        args.settle,
        args.gc,
        args.setup,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(render_markdown(results))
    if args.write_doc:
        write_doc(results)


if __name__ == "__main__":
    main()
