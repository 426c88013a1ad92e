"""Where a provider driver's CPU goes: py-spy samples of its measured phase, by part.

    python benchmarks/profile_provider.py [--provider ours|peer] [--ours-setup readme|bare] \
        [--concurrency 64] [--seconds 20] [--out benchmarks/results/profile.json]

Starts the scripted dev server and one driver (``provider_driver.py --wait-for-start --run-for``, in the
peer venv as ``bench_provider`` runs it), attaches ``py-spy record --native -f raw`` (installed in the
peer venv: ``pip install py-spy``) for ``--seconds`` of the measured phase only, and counts each sample
once, by the innermost frame that names a part (:data:`PARTS`, first match wins; a collector pass or a
tokenizer call counts as such wherever it runs). Prints the shares, largest first.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_provider

PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "cyclic garbage collector",
        ("gc_collect", "collect_with_callback", "gc_collect_main", "deduce_unreachable"),
    ),
    ("Hugging Face tokenizers (native)", ("tokenizers::", "tokenizers.abi3", "libtokenizers")),
    ("quicktok (the fast-tokenizer extra)", ("_quicktok", "quicktok")),
    ("chat template (jinja2)", ("jinja2/", "chat_template_utils")),
    ("Strands' deep copy of the history", ("copy.py",)),
    ("Strands' tracer", ("strands/telemetry/",)),
    ("JSON (orjson, json)", ("orjson", "json/", "_json")),
    ("aiohttp", ("aiohttp/", "multidict", "yarl/", "_http_parser", "_websocket")),
    ("the provider's own Python (ours)", ("strands_slime/",)),
    ("the provider's own Python (peer)", ("strands_sglang/",)),
    ("Strands: agent loop, events, hooks, tool executor", ("strands/",)),
    (
        "asyncio (tasks, the loop, thread hand-off)",
        ("asyncio/", "selectors.py", "concurrent/futures", "threading.py"),
    ),
    ("benchmark driver (tool, ticker)", ("provider_driver.py", "transcripts.py")),
)


def classify(stack: str) -> str:
    """The part of one sampled stack (frames outermost first, ``;``-separated)."""
    frames = stack.split(";")
    for frame in reversed(frames):
        for part, needles in PARTS:
            if any(needle in frame for needle in needles):
                return part
    return "other (interpreter, libc, unattributed)"


def profile(provider: str, setup: str, concurrency: int, seconds: float) -> dict[str, Any]:
    python = bench_provider.setup_peer_venv()
    py_spy = python.parent / "py-spy"
    if not py_spy.exists():
        raise SystemExit(f"py-spy is not installed in the peer venv: {python} -m pip install py-spy")
    work = Path(tempfile.mkdtemp(prefix="profile-provider-"))
    _, transcripts_file, script_file = bench_provider.write_workload(64, work)
    raw = work / "profile.txt"
    with bench_provider.Server(script_file) as server:
        command = bench_provider.driver_command(
            python,
            provider,
            server,
            transcripts_file,
            concurrency,
            concurrency,
            work / "out.json",
            ours_setup=setup,
        )
        command += ["--wait-for-start", "--run-for", str(seconds + 6)]
        driver = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=bench_provider.REPO_ROOT
        )
        assert driver.stdout is not None and driver.stdin is not None
        while driver.stdout.readline().strip() != "ready":
            if driver.poll() is not None:
                raise SystemExit("the driver ended before its warm-up was done")
        driver.stdin.write(f"{time.time() + 0.5}\n")
        driver.stdin.close()
        time.sleep(3.0)  # past the first round's start-up
        subprocess.run(
            [
                str(py_spy),
                "record",
                "--native",
                "-r",
                "200",
                "-f",
                "raw",
                "--pid",
                str(driver.pid),
                "--duration",
                str(int(seconds)),
                "-o",
                str(raw),
            ],
            check=True,
            capture_output=True,
        )
        driver.wait(timeout=600)
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit() and "idle" not in stack.rsplit(";", 1)[-1]:
            counts[classify(stack)] += int(count)
    total = sum(counts.values())
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "provider": provider,
        "ours_setup": setup if provider == "ours" else None,
        "concurrency": concurrency,
        "seconds": seconds,
        "samples": total,
        "shares": {part: count / total for part, count in counts.most_common()} if total else {},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", default="ours", choices=("ours", "peer"))
    parser.add_argument("--ours-setup", default="readme", choices=("readme", "bare"))
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = profile(args.provider, args.ours_setup, args.concurrency, args.seconds)
    for part, share in result["shares"].items():
        print(f"| {part} | {share * 100:.0f} % |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
