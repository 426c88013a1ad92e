"""Sample every GPU's memory, and which role holds it, with nvidia-smi until stopped.

    python3 -m strands_slime.launch.gpu_sampler --out FILE [--interval SECONDS] [--node RANK]

One JSON line per sample: ``{"time", "node", "gpus": [{"index", "used_mib", "total_mib", "util"}],
"apps": [{"gpu", "pid", "used_mib", "role"}]}``; SIGTERM or SIGINT ends it after the current sample.
The role comes from the process's command line (Ray's and SGLang's process titles; ``unknown`` when
the PID is not visible here). Standard library only: it runs in slime's image as is. The pilot reads
the files back (docs/training.md, §2.6).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

GPU_QUERY = ("index,uuid,memory.used,memory.total,utilization.gpu", "--query-gpu")
APP_QUERY = ("gpu_uuid,pid,used_memory", "--query-compute-apps")
NVIDIA_SMI_TIMEOUT_S = 20.0


def role_of(cmdline: str | None) -> str:
    """``rollout``, ``train``, ``other`` or (no command line) ``unknown``."""
    if cmdline is None:
        return "unknown"
    text = cmdline.lower()
    if "sglang" in text:
        return "rollout"
    if "trainrayactor" in text or "megatron" in text:
        return "train"
    return "other"


def _cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode("utf-8", errors="replace").strip() or None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def _query(fields: str, flag: str) -> list[list[str]]:
    result = subprocess.run(
        ["nvidia-smi", f"{flag}={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=NVIDIA_SMI_TIMEOUT_S,
        check=True,
    )
    return [[cell.strip() for cell in line.split(",")] for line in result.stdout.splitlines() if line.strip()]


def sample(node: int) -> dict[str, Any]:
    """One reading of every GPU and every process using one.

    Raises:
        OSError, subprocess.SubprocessError: nvidia-smi is missing, failed or hung.
    """
    gpus: list[dict[str, Any]] = []
    index_of: dict[str, int] = {}
    for index, uuid, used, total, util in _query(*GPU_QUERY):
        index_of[uuid] = int(index)
        gpus.append(
            {
                "index": int(index),
                "used_mib": _number(used),
                "total_mib": _number(total),
                "util": _number(util),
            }
        )
    apps = []
    for uuid, pid, used in _query(*APP_QUERY):
        if not pid.isdigit():
            continue
        apps.append(
            {
                "gpu": index_of.get(uuid),
                "pid": int(pid),
                "used_mib": _number(used),
                "role": role_of(_cmdline(int(pid))),
            }
        )
    return {"time": time.time(), "node": node, "gpus": gpus, "apps": apps}


def run(out: Path, interval_s: float, node: int, stop: threading.Event) -> int:
    """Append a sample to ``out`` every ``interval_s`` until ``stop`` is set; the number written.

    A failed reading is written as ``{"time", "node", "error"}`` and sampling goes on.
    """
    written = 0
    with out.open("a", encoding="utf-8") as file:
        while not stop.is_set():
            try:
                record = sample(node)
            except (OSError, subprocess.SubprocessError, ValueError) as error:
                record = {"time": time.time(), "node": node, "error": f"{type(error).__name__}: {error}"}
            file.write(json.dumps(record) + "\n")
            file.flush()
            written += 1
            stop.wait(interval_s)
    return written


def main(argv: list[str] | None = None) -> int:
    """Command line: sample until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON-lines file to append to")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--node", type=int, default=0, help="this node's rank, recorded in every line")
    options = parser.parse_args(argv)
    if options.interval <= 0:
        parser.error("--interval must be > 0")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    options.out.parent.mkdir(parents=True, exist_ok=True)
    run(options.out, options.interval, options.node, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
