"""PNG of the provider concurrency sweep: turns/s and CPU ms per turn against concurrent episodes.

python benchmarks/plot.py [benchmarks/results/provider.json] [docs/benchmarks-concurrency.png]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = REPO_ROOT / "benchmarks" / "results" / "provider.json"
DEFAULT_PNG = REPO_ROOT / "docs" / "benchmarks-concurrency.png"

STYLES = {
    "ours": {"label": "strands_slime (ours)", "color": "#1f77b4", "marker": "o"},
    "peer": {"label": "strands-sglang 0.6.2", "color": "#d62728", "marker": "s"},
    "floor": {"label": "Strands floor (no provider work)", "color": "#7f7f7f", "marker": "^"},
}


def plot_sweep(results: dict[str, Any], out: Path) -> Path:
    """Two panels sharing a log-scaled concurrency axis; one line per provider."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = results["sweep"]
    concurrencies = sorted(sweep, key=int)
    providers = [p for p in ("ours", "peer", "floor") if all(p in sweep[c] for c in concurrencies)]
    if not concurrencies or not providers:
        raise ValueError("the results have no concurrency sweep to plot")
    xs = [int(c) for c in concurrencies]
    figure, (throughput, cpu) = plt.subplots(1, 2, figsize=(11, 4.2))
    for provider in providers:
        style = STYLES[provider]
        turns = [sweep[c][provider]["turns_per_s"] for c in concurrencies]
        cost = [sweep[c][provider]["cpu_ms_per_turn"] for c in concurrencies]
        if provider != "floor":  # no server round trip: its turns/s is not comparable
            throughput.plot(xs, turns, marker=style["marker"], color=style["color"], label=style["label"])
        cpu.plot(xs, cost, marker=style["marker"], color=style["color"], label=style["label"])
    for axis in (throughput, cpu):
        axis.set_xscale("log", base=2)
        axis.set_xticks(xs, [str(x) for x in xs])
        axis.set_xlabel("concurrent episodes")
        axis.grid(True, alpha=0.3)
    throughput.set_ylabel("agent turns per second (end to end)")
    throughput.set_title("Throughput against a zero-latency scripted server")
    cpu.set_ylabel("driver CPU ms per agent turn")
    cpu.set_title("Client CPU per turn (lower is better)")
    cpu.set_ylim(bottom=0)
    throughput.set_ylim(bottom=0)
    cpu.legend(loc="best", fontsize=8)
    throughput.legend(loc="best", fontsize=8)
    machine = results.get("machine", {})
    figure.suptitle(
        f"Provider benchmark, {results.get('date', '')[:10]}, {machine.get('cpu', '')} "
        f"({machine.get('cpus', '?')} CPUs), {results.get('pinning', '')}",
        fontsize=9,
    )
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    results_path = Path(args[0]) if args else DEFAULT_RESULTS
    out = Path(args[1]) if len(args) > 1 else DEFAULT_PNG
    print(plot_sweep(json.loads(results_path.read_text()), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
