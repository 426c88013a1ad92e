"""Stand-ins for what a launch needs from a GPU box: ``nvidia-smi`` and the ``ray`` package's version.

``nvidia-smi`` answers the queries ``strands_slime.launch`` makes: the GPU list, memory per GPU and the
processes on them. ``FAKE_GPUS`` (8), ``FAKE_GPU_USED_MIB`` (1000) and ``FAKE_GPU_APPS``
(``uuid, pid, MiB`` entries separated by ``;``) shape its answers.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

# nvidia-smi on a box with FAKE_GPUS GPUs (8) that each use FAKE_GPU_USED_MIB of 81559 MiB.
FAKE_NVIDIA_SMI = """#!{python}
import os, sys

gpus = int(os.environ.get("FAKE_GPUS", "8"))
query = next((a for a in sys.argv[1:] if a.startswith("--query-")), "")
if query == "--query-gpu=index":
    print("\\n".join(str(i) for i in range(gpus)))
elif query.startswith("--query-gpu="):
    used = os.environ.get("FAKE_GPU_USED_MIB", "1000")
    print("\\n".join(f"{{i}}, GPU-{{i}}, {{used}}, 81559, 50" for i in range(gpus)))
elif query.startswith("--query-compute-apps="):
    for entry in filter(None, os.environ.get("FAKE_GPU_APPS", "").split(";")):
        print(entry)
"""


def install_fake_nvidia_smi(bin_dir: Path) -> Path:
    """Write the stand-in ``nvidia-smi`` into ``bin_dir``."""
    path = bin_dir / "nvidia-smi"
    path.write_text(FAKE_NVIDIA_SMI.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
