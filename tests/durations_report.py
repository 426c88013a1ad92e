"""Turn ``pytest --durations=0`` output into tests/durations.md: each test's time and lane.

Usage::

    python -m pytest -p no:cacheprovider --durations=0 -q > /tmp/durations.txt
    python tests/durations_report.py /tmp/durations.txt > tests/durations.md

A test's time is its setup + call + teardown; the lane is the one ``pytest --lane`` gives it. A test
of the unit or integration lane that takes over ~2 s on an idle machine belongs in the slow lane.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

_LINE = re.compile(r"^(?P<seconds>\d+\.\d+)s (?P<phase>setup|call|teardown)\s+(?P<nodeid>\S.*)$")


def parse(text: str) -> dict[str, float]:
    """Seconds per test node id, phases summed."""
    totals: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match:
            totals[match["nodeid"]] += float(match["seconds"])
    return dict(totals)


def lanes_by_test() -> dict[str, str]:
    """Each collected test's lane, as ``pytest --lane`` sees it (module maps and marks in the files)."""
    lanes: dict[str, str] = {}
    for lane in ("unit", "integration", "slow"):
        listing = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                "--lane",
                lane,
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        ).stdout
        lanes.update({line.strip(): lane for line in listing.splitlines() if "::" in line})
    return lanes


def report(totals: dict[str, float], lanes: dict[str, str], source: str) -> str:
    """Markdown: per-lane totals, then every test over 0.1 s, slowest first, with its lane."""
    seconds_by_lane: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for nodeid, lane in lanes.items():
        seconds_by_lane[lane] += totals.get(nodeid, 0.0)
        counts[lane] += 1
    lines = [
        "# Test durations",
        "",
        f"Measured {source}. Seconds are wall-clock (setup + call + teardown), so on a shared machine",
        "they include waiting for the CPU. Regenerate with `tests/durations_report.py` (see its docstring).",
        "",
        "| lane | tests | seconds |",
        "|---|---|---|",
    ]
    for lane in ("unit", "integration", "slow"):
        lines.append(f"| {lane} | {counts[lane]} | {seconds_by_lane[lane]:.1f} |")
    lines += ["", "Every test over 0.1 s, slowest first:", "", "| seconds | lane | test |", "|---|---|---|"]
    for nodeid, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        if seconds < 0.1:
            break
        lines.append(f"| {seconds:.2f} | {lanes.get(nodeid, '(renamed or removed)')} | `{nodeid}` |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    """Read the durations output named in ``argv[0]`` and print the report."""
    source = argv[1] if len(argv) > 1 else "with `pytest --durations=0`"
    print(report(parse(Path(argv[0]).read_text()), lanes_by_test(), source), end="")


if __name__ == "__main__":
    main(sys.argv[1:])
