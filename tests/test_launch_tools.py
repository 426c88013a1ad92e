"""What every node runs around a launch, in real subprocesses: the pilot's GPU sampler (nvidia-smi, stood in
for, and the roles of real processes named as Ray and SGLang name theirs) and the node preflight (GPUs,
Ray's version, the W&B key, the installed sglang-router's acceptance of our router options, storage)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from launch_stand_ins import install_fake_nvidia_smi
from waiting import wait_until_sync

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def box(tmp_path: Path) -> dict[str, str]:
    """An environment with the stand-in nvidia-smi first on PATH and a `ray` package of version 2.52.0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    install_fake_nvidia_smi(bin_dir)
    ray = tmp_path / "modules" / "ray"
    ray.mkdir(parents=True)
    (ray / "__init__.py").write_text('__version__ = "2.52.0"\n')
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PYTHONPATH": f"{REPO}:{tmp_path / 'modules'}",
        "HOME": str(tmp_path),
    }


def _preflight(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strands_slime.launch.preflight", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# ----------------------------------------------------------------------------- gpu_sampler


@pytest.fixture
def named_processes():
    """Processes titled like slime's actors: an SGLang scheduler and a Megatron training actor."""
    names = ["sglang::scheduler_TP0", "ray::MegatronTrainRayActor.train", "python some_other_job.py"]
    processes = [subprocess.Popen(["bash", "-c", f'exec -a "{name}" sleep 60']) for name in names]

    def execed() -> bool:
        return all(
            "sleep" not in Path(f"/proc/{p.pid}/cmdline").read_bytes().decode(errors="replace")
            for p in processes
        )

    wait_until_sync(execed, timeout=10, what="the named processes to exec")
    yield processes
    for process in processes:
        process.kill()
        process.wait()


def test_the_sampler_records_every_gpu_and_the_role_of_each_process_until_sigterm(
    box: dict[str, str], tmp_path: Path, named_processes: list[subprocess.Popen]
) -> None:
    rollout, train, other = (p.pid for p in named_processes)
    apps = f"GPU-0, {rollout}, 60000;GPU-1, {train}, 40000;GPU-1, {other}, 500;GPU-1, 999999999, 100;GPU-1, [N/A], 1"
    out = tmp_path / "pilot" / "gpu-node3.jsonl"
    sampler = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "strands_slime.launch.gpu_sampler",
            "--out",
            str(out),
            "--node",
            "3",
            "--interval",
            "0.2",
        ],
        env={**box, "FAKE_GPUS": "2", "FAKE_GPU_USED_MIB": "61000", "FAKE_GPU_APPS": apps},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until_sync(
            lambda: out.exists() and len(out.read_text().splitlines()) >= 2, timeout=30, what="samples"
        )
        sampler.send_signal(signal.SIGTERM)
        assert sampler.wait(timeout=10) == 0, sampler.stderr.read() if sampler.stderr else ""
    finally:
        if sampler.poll() is None:
            sampler.kill()
            sampler.wait()
    first = json.loads(out.read_text().splitlines()[0])
    assert first["node"] == 3
    assert first["gpus"] == [
        {"index": 0, "used_mib": 61000.0, "total_mib": 81559.0, "util": 50.0},
        {"index": 1, "used_mib": 61000.0, "total_mib": 81559.0, "util": 50.0},
    ]
    roles = {app["pid"]: (app["gpu"], app["role"]) for app in first["apps"]}
    assert roles == {
        rollout: (0, "rollout"),
        train: (1, "train"),
        other: (1, "other"),
        999999999: (1, "unknown"),
    }


def test_a_failed_reading_is_recorded_and_sampling_goes_on(box: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "gpu.jsonl"
    env = {**box, "PATH": "/usr/bin:/bin"}  # no nvidia-smi at all
    sampler = subprocess.Popen(
        [sys.executable, "-m", "strands_slime.launch.gpu_sampler", "--out", str(out), "--interval", "0.1"],
        env=env,
    )
    try:
        wait_until_sync(
            lambda: out.exists() and len(out.read_text().splitlines()) >= 2, timeout=30, what="samples"
        )
    finally:
        sampler.terminate()
        sampler.wait(timeout=10)
    record = json.loads(out.read_text().splitlines()[0])
    assert record["error"].startswith("FileNotFoundError") and "gpus" not in record


# ----------------------------------------------------------------------------- preflight


def test_a_ready_node_passes(box: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("sglang_router")
    result = _preflight(
        {**box, "WANDB_API_KEY": "k"},
        "--gpus",
        "8",
        "--ray-version",
        "2.52.0",
        "--wandb-key-required",
        "--router-arg=--router-policy",
        "--router-arg=manual",
        "--router-arg=--router-assignment-mode",
        "--router-arg=min_load",
        "--writable",
        str(tmp_path / "shared" / "ckpt"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("preflight OK: ray 2.52.0")
    assert (tmp_path / "shared" / "ckpt").is_dir()


def test_every_problem_of_a_node_is_named_on_its_own_line(box: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("sglang_router")
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o500)
    result = _preflight(
        {**box, "FAKE_GPUS": "4", "CUDA_VISIBLE_DEVICES": "0,1"},
        "--gpus",
        "8",
        "--ray-version",
        "2.53.1",
        "--wandb-key-required",
        # slime's docs name consistent_hashing; the public sglang-router 0.3.2 parser rejects it
        "--router-arg=--router-policy",
        "--router-arg=consistent_hashing",
        "--writable",
        str(read_only / "sub"),
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("preflight error: ")]
    assert errors[0].endswith("2 GPU(s) visible on this node, GPUS_PER_NODE is 8")
    assert "ray 2.52.0 here, ray 2.53.1 on the head" in errors[1]
    assert "no WANDB_API_KEY" in errors[2]
    assert "rejects --router-policy consistent_hashing" in errors[3]
    if os.geteuid() != 0:  # root writes anywhere
        assert "cannot write to" in errors[4]
    notes = _preflight({**box, "FAKE_GPUS": "4"}, "--gpus", "8", "--notes-only")
    assert notes.returncode == 0 and "preflight note (dry run, not fatal): 4 GPU(s)" in notes.stderr


def test_a_node_without_nvidia_smi_ray_or_a_router(box: dict[str, str], tmp_path: Path) -> None:
    no_ray = tmp_path / "no_ray" / "ray"  # the test venv has ray: this node must not
    no_ray.mkdir(parents=True)
    (no_ray / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    env = {**box, "PATH": "/usr/bin:/bin", "PYTHONPATH": f"{no_ray.parent}:{REPO}"}
    result = _preflight(env, "--gpus", "1", "--router-arg=--router-policy", "--router-arg=manual")
    errors = result.stderr
    assert result.returncode == 1
    assert "nvidia-smi failed (FileNotFoundError" in errors
    if "ray is not importable" not in errors:
        pytest.fail(f"expected the missing ray package to be named: {errors}")


ROLLOUT_CONFIG = REPO / "configs" / "strands_math.yaml"


def _config_with_sandbox(tmp_path: Path, setting: str) -> Path:
    path = tmp_path / "rollout.yaml"
    path.write_text(ROLLOUT_CONFIG.read_text().replace("  sandbox:\n", f"  sandbox:\n    {setting}\n", 1))
    return path


def test_a_sandbox_on_the_host_network_is_refused_unless_accepted(
    box: dict[str, str], tmp_path: Path
) -> None:
    config = _config_with_sandbox(tmp_path, "network: allow")
    refused = _preflight(box, "--gpus", "8", "--sandbox-config", str(config))
    assert refused.returncode == 1
    (error,) = [line for line in refused.stderr.splitlines() if "sandbox" in line]
    assert error.startswith("preflight error: the sandbox cannot isolate model-written code from the network")
    assert (
        "sandbox.network: allow" in error
        and "--cap-add SYS_ADMIN" in error
        and "SANDBOX_HOST_NETWORK=1" in error
    )
    accepted = _preflight(box, "--gpus", "8", "--sandbox-config", str(config), "--allow-host-network")
    assert accepted.returncode == 0, accepted.stderr
    assert "preflight note: SANDBOX_HOST_NETWORK=1: the sandbox cannot isolate" in accepted.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="drops CAP_SYS_ADMIN with setpriv, as root"
)
def test_without_cap_sys_admin_the_real_sandbox_falls_back_and_the_preflight_says_so(
    box: dict[str, str],
) -> None:
    # What a `docker run` without --cap-add SYS_ADMIN gives: no network namespace for the sandbox.
    args = ["--gpus", "8", "--sandbox-config", str(ROLLOUT_CONFIG)]
    isolated = _preflight(box, *args)
    assert "sandbox" not in isolated.stderr, "with CAP_SYS_ADMIN the sandbox isolates the network"
    dropped = subprocess.run(
        ["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", sys.executable]
        + ["-m", "strands_slime.launch.preflight", *args],
        env=box,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert dropped.returncode == 1
    assert "preflight error: the sandbox cannot isolate model-written code from the network" in dropped.stderr
