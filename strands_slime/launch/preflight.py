"""Checks each node runs before it starts or joins Ray: what would otherwise fail hours into a job.

    python3 -m strands_slime.launch.preflight --gpus 8 [--ray-version 2.52.1] [--wandb-key-required]
        [--router-arg=--router-policy --router-arg=manual ...] [--writable DIR ...] [--notes-only]

One line per problem on stderr, exit 1 when there is any (``--notes-only``: printed as notes, exit 0,
for the dry run away from the GPU box). Every node runs it, since Ray may place any actor on any node.
What is checked (GPUs, Ray version, W&B key, router options, storage, sandbox network isolation and
``--allow-host-network``): docs/training.md, §6.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

NVIDIA_SMI_TIMEOUT_S = 30.0


def visible_gpus() -> int:
    """GPUs this node's processes can use: nvidia-smi's list, narrowed by ``CUDA_VISIBLE_DEVICES``.

    Raises:
        OSError, subprocess.SubprocessError: nvidia-smi is missing, failed or hung.
    """
    result = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=NVIDIA_SMI_TIMEOUT_S,
        check=True,
    )
    listed = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return len(listed)
    wanted = [item.strip() for item in visible.split(",") if item.strip()]
    return len([item for item in wanted if item in listed or not item.isdigit()])


def check_gpus(wanted: int) -> list[str]:
    """A problem when fewer than ``wanted`` GPUs are visible."""
    try:
        found = visible_gpus()
    except (OSError, subprocess.SubprocessError) as error:
        return [f"cannot count the GPUs: nvidia-smi failed ({type(error).__name__}: {error})"]
    if found < wanted:
        return [f"{found} GPU(s) visible on this node, GPUS_PER_NODE is {wanted}"]
    return []


def ray_version() -> str | None:
    """The version of the ``ray`` package this interpreter imports, or None."""
    try:
        import ray
    except ImportError:
        return None
    return str(getattr(ray, "__version__", "unknown"))


def check_ray(head_version: str | None) -> list[str]:
    """Ray must be importable, at the head's version when one is given."""
    found = ray_version()
    if found is None:
        return ["ray is not importable by python3 on this node"]
    if head_version and found != head_version:
        return [f"ray {found} here, ray {head_version} on the head: every node needs the same version"]
    return []


def check_wandb(required: bool) -> list[str]:
    """The W&B key must be here when the head has one."""
    if required and not os.environ.get("WANDB_API_KEY", "").strip():
        return [
            "the head logs to W&B but this node has no WANDB_API_KEY (set WANDB_API_KEY or "
            "WANDB_API_KEY_FILE here too: training ranks on every node log)"
        ]
    return []


def check_router(router_args: Sequence[str]) -> list[str]:
    """The installed sglang_router must accept ``router_args`` (parsed as slime adds its options)."""
    if not router_args:
        return []
    try:
        from sglang_router.launch_router import RouterArgs
    except ImportError as error:
        return [f"sglang_router is not importable on this node ({error})"]
    parser = argparse.ArgumentParser(prog="sglang_router", add_help=False, exit_on_error=False)
    try:
        RouterArgs.add_cli_args(parser, use_router_prefix=True, exclude_host_port=True)
    except Exception as error:  # a router build with another builder signature
        return [f"cannot read the installed router's options: {type(error).__name__}: {error}"]
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages):
            parser.parse_args(list(router_args))
    except (argparse.ArgumentError, SystemExit) as error:
        detail = str(error) if isinstance(error, argparse.ArgumentError) else messages.getvalue().strip()
        detail = detail.splitlines()[-1] if detail else "rejected"
        return [f"the installed sglang_router rejects {' '.join(router_args)}: {detail}"]
    return []


def check_writable(directories: Sequence[Path]) -> list[str]:
    """Each directory must exist (or be creatable) and take a file."""
    problems = []
    for directory in directories:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".preflight-"):
                pass
        except OSError as error:
            problems.append(f"cannot write to {directory}: {error.strerror or error}")
    return problems


def sandbox_network(rollout_config: Path) -> tuple[str, str]:
    """The network the rollout's sandbox gets on this node (``per_call``, ``shared`` or ``host``) and why.

    Starts the configured sandbox (without its preloads: only its isolation matters here) and reads
    its capabilities, so the answer is what model code would get, not a guess from the kernel.
    """
    import asyncio

    from strands_slime.config import load_config
    from strands_slime.sandbox import Sandbox

    config = load_config(rollout_config).sandbox
    if config.backend == "camel":
        return "host", "the camel backend has no isolation"
    if config.network == "allow":
        return "host", "the rollout config sets sandbox.network: allow"
    # a Ray actor pool runs a zygote sandbox with these settings on every node: probe one here
    probe = config.model_copy(update={"backend": "zygote", "preload_modules": (), "zygote_warm_up": ""})

    async def _probe() -> tuple[str, str]:
        async with Sandbox(probe) as box:
            capabilities = box.capabilities
        warnings = [w for w in capabilities.get("warnings", []) if "network" in str(w)]
        return str(capabilities.get("network", "host")), "; ".join(map(str, warnings))

    return asyncio.run(_probe())


def check_sandbox_network(rollout_config: Path | None, allow_host: bool) -> tuple[list[str], list[str]]:
    """(problems, notes): the sandbox must isolate model code from the network, unless accepted."""
    if rollout_config is None:
        return [], []
    try:
        network, why = sandbox_network(rollout_config)
    except Exception as error:  # a broken sandbox is a problem of its own, reported in one line
        return [
            f"cannot start the rollout's sandbox to check its isolation: {type(error).__name__}: {error}"
        ], []
    if network != "host":
        return [], []
    problem = (
        f"the sandbox cannot isolate model-written code from the network on this node ({why or 'no network namespace'}): "
        "it could reach the router, the engines, the cloud metadata service and the internet. Run the "
        "container with --cap-add SYS_ADMIN (docs/training.md, 'Sandbox isolation'), or accept it with "
        "SANDBOX_HOST_NETWORK=1"
    )
    if allow_host:
        return [], [f"SANDBOX_HOST_NETWORK=1: {problem.split(' (')[0]} (accepted)"]
    return [problem], []


def main(argv: list[str] | None = None) -> int:
    """Run every check; one line per problem."""
    parser = argparse.ArgumentParser(prog="python -m strands_slime.launch.preflight")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs this node must have")
    parser.add_argument("--ray-version", help="the head's Ray version (every node must match)")
    parser.add_argument("--wandb-key-required", action="store_true")
    parser.add_argument("--router-arg", action="append", default=[], help="one token of the router options")
    parser.add_argument("--writable", type=Path, action="append", default=[])
    parser.add_argument("--notes-only", action="store_true", help="report problems without failing")
    parser.add_argument("--sandbox-config", type=Path, help="the rollout config whose sandbox must isolate")
    parser.add_argument(
        "--allow-host-network", action="store_true", help="accept a sandbox on the host network"
    )
    options = parser.parse_args(argv)
    sandbox_problems, notes = check_sandbox_network(options.sandbox_config, options.allow_host_network)
    for note in notes:
        print(f"preflight note: {note}", file=sys.stderr)
    problems = [
        *sandbox_problems,
        *check_gpus(options.gpus),
        *check_ray(options.ray_version),
        *check_wandb(options.wandb_key_required),
        *check_router(options.router_arg),
        *check_writable(options.writable),
    ]
    for problem in problems:
        prefix = "note (dry run, not fatal)" if options.notes_only else "error"
        print(f"preflight {prefix}: {problem}", file=sys.stderr)
    if problems and not options.notes_only:
        return 1
    print(f"preflight OK: ray {ray_version() or 'missing'}, {options.gpus}+ GPUs wanted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
