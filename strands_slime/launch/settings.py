"""What a training launch reads from its environment: every variable's default, the presets, and the
checks of each value, so that a wrong setting stops the launch in one line before anything starts.

``scripts/strands_qwen3_8b.sh`` documents the variables (``--help``, :mod:`strands_slime.launch.usage`);
:func:`read_settings` turns them into one typed :class:`LaunchSettings`. Only the standard library: this
runs in slime's image before anything else.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PRESETS: dict[str, dict[str, str]] = {
    "1x8": {},
    # Four times the GPUs: four times the episodes per rollout, in optimizer updates of the one-node
    # recipe's 128 samples (four per rollout, as DAPO takes several), at the same learning rate; a
    # quarter of the rollouts, so the run sees as many samples and updates.
    "4x8": {"NUM_NODES": "4", "ROLLOUT_BATCH_SIZE": "64", "GLOBAL_BATCH_SIZE": "128", "NUM_ROLLOUT": "750"},
}
ROUTER_POLICIES = ("manual", "consistent_hashing", "cache_aware", "round_robin", "random", "power_of_two")
ROUTER_ASSIGNMENT_MODES = ("min_load", "min_group", "random")
OFF_POLICY_CORRECTIONS = ("tis", "rollout-logprobs", "none")
LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "")
_NUMBER = re.compile(r"^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class LaunchError(Exception):
    """A setting or input that stops the launch: one line for the user, nothing started."""


@dataclass(frozen=True)
class LaunchSettings:
    """Every setting of one node's launch, resolved and checked (names as the environment's)."""

    preset: str
    user_set_batch: bool
    slime_dir: str
    megatron_dir: str
    strands_slime_dir: str
    model_dir: str
    hf_checkpoint: str
    ref_load: str
    save_dir: str
    data_dir: str
    prompt_data: str
    eval_data: str
    eval_config: str
    rollout_config: str
    num_nodes: int
    node_rank: int
    master_addr: str
    node_ip: str
    slime_host_ip: str
    gpus_per_node: int
    ray_port: int
    ray_dashboard_port: int
    ray_dashboard_host: str
    ray_wait_timeout: int
    ray_stop_timeout: int
    ray_poll_interval: int
    ray_status_timeout: int
    ray_auth: str
    ray_auth_token_file: str
    ray_node_resources: str
    checkpoint_gb: int
    run_dir: str
    ray_temp_dir: str
    num_rollout: int
    rollout_batch_size: int
    over_sampling_batch_size: int
    n_samples_per_prompt: int
    global_batch_size: int
    dynamic_sampling: bool
    partial_rollout: bool
    mask_offpolicy_in_partial_rollout: bool
    max_response_len: int
    rollout_temperature: str
    eval_interval: int
    n_samples_per_eval_prompt: int
    eval_max_response_len: int
    save_hours: str
    save_interval: int | None
    step_minutes: str
    keep_checkpoints: str
    max_restarts: int
    restart_window_hours: str
    max_restarts_without_progress: int
    restart_backoff: int
    restart_backoff_max: int
    watchdog_minutes: int
    pilot: bool
    pilot_steps: int
    pilot_dir: str
    pilot_json: str
    pilot_keep_checkpoint: bool
    gpu_hour_price: str
    run_hours: str
    tp_size: int
    max_tokens_per_gpu: int
    rollout_gpus_per_engine: int
    sglang_mem_fraction: str
    router_policy: str
    router_assignment_mode: str
    lr: str
    kl_loss_coef: str
    entropy_coef: str
    off_policy_correction: str
    wandb_api_key: str = field(repr=False)
    wandb_project: str
    wandb_group: str
    sandbox_host_network: bool
    kill_stale: bool
    reuse_ray: bool
    keep_ray: bool
    launch_checked: bool
    dry_run: bool
    has_nvlink: bool | None
    pythonpath: str
    extra_train_args: tuple[str, ...] = ()

    @property
    def total_gpus(self) -> int:
        """GPUs of the whole cluster."""
        return self.num_nodes * self.gpus_per_node

    @property
    def node_dir(self) -> str:
        """This node's logs and, on rank 0, the run's state (``$RUN_DIR/node<rank>``)."""
        return f"{self.run_dir}/node{self.node_rank}"


def as_bool(name: str, value: str) -> bool:
    """1/true/yes/on (any case) or 0/false/no/off/empty; anything else is refused."""
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise LaunchError(f"{name}: expected a boolean (1/0, true/false, yes/no, on/off), got '{value}'")


def as_int(name: str, value: str, minimum: int) -> int:
    """A non-negative integer of at least ``minimum``."""
    if not value.isascii() or not value.isdigit():
        raise LaunchError(f"{name} must be a non-negative integer, got '{value}'")
    number = int(value)
    if number < minimum:
        raise LaunchError(f"{name} must be >= {minimum}, got {value}")
    return number


def as_number(name: str, value: str) -> str:
    """A decimal number (1, 0.4, 1e-6), kept as written: it goes onto train.py's command line."""
    if not _NUMBER.match(value):
        raise LaunchError(f"{name} must be a number, got '{value}'")
    return value


def _choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        listed = ", ".join(choices[:-1]) + f" or {choices[-1]}"
        raise LaunchError(f"{name} must be {listed}, got '{value}'")
    return value


def _resources(value: str) -> str:
    try:
        parsed = json.loads(value) if value else {}
    except json.JSONDecodeError:
        parsed = None
    valid = isinstance(parsed, dict) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in parsed.values()
    )
    if not valid:
        raise LaunchError(
            f"RAY_NODE_RESOURCES must be a JSON object of resource amounts, e.g. '{{\"rollout_cpu\": 32}}', "
            f"got '{value}'"
        )
    return value


def route_source_address(master_addr: str, port: int) -> str:
    """This node's source address on the route to the head (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master_addr, port))
        return str(probe.getsockname()[0])


def read_wandb_key_file(path: str) -> str:
    """The W&B key from a file only its owner can read."""
    key_file = Path(path)
    if not key_file.is_file() or not os.access(key_file, os.R_OK):
        raise LaunchError(f"WANDB_API_KEY_FILE is not a readable file: {path}")
    mode = stat.S_IMODE(key_file.stat().st_mode)
    if mode & 0o077:
        raise LaunchError(f"WANDB_API_KEY_FILE ({path}) is readable by others (mode {mode:o}); chmod 600 it")
    key = "".join(key_file.read_text().split())
    if not key:
        raise LaunchError(f"WANDB_API_KEY_FILE ({path}) is empty")
    return key


def read_settings(
    environ: Mapping[str, str],
    *,
    repo_root: Path,
    pilot: bool = False,
    dry_run: bool = False,
    extra_train_args: Sequence[str] = (),
    note: Callable[[str], None] = lambda _: None,
    resolve_address: Callable[[str, int], str] = route_source_address,
) -> LaunchSettings:
    """The launch's settings from ``environ``: defaults for what is unset (or empty), then every check.

    ``pilot`` and ``dry_run`` are the command line's ``--pilot`` and ``--dry-run`` (the environment's
    ``PILOT`` and ``DRY_RUN`` also turn them on); ``note`` receives advice that does not stop the launch.

    Raises:
        LaunchError: the first setting that is wrong, in one line.
    """
    dry_run = as_bool("DRY_RUN", environ.get("DRY_RUN", "")) or dry_run
    pilot = as_bool("PILOT", environ.get("PILOT", "")) or pilot
    preset = environ.get("PRESET") or "1x8"
    if preset not in PRESETS:
        raise LaunchError(f"PRESET must be 1x8 or 4x8, got '{preset}'")
    user_set_batch = bool(environ.get("ROLLOUT_BATCH_SIZE") or environ.get("GLOBAL_BATCH_SIZE"))
    defaults = PRESETS[preset]

    def get(name: str, default: str = "") -> str:
        """The variable's value; unset and empty mean the (preset's) default."""
        return environ.get(name) or defaults.get(name, default)

    strands_slime_dir = get("STRANDS_SLIME_DIR", str(repo_root))
    model_dir = get("MODEL_DIR", "/root/models")
    save_dir = get("SAVE_DIR", "/root/checkpoints/qwen3-8b-strands-slime")
    data_dir = get("DATA_DIR", "/root/data")
    pilot_dir = get("PILOT_DIR", f"{save_dir}/pilot")
    ray_port_text = get("RAY_PORT", "6379")
    resources = _resources(get("RAY_NODE_RESOURCES"))

    def integer(name: str, default: str, minimum: int) -> int:
        return as_int(name, get(name, default), minimum)

    rollout_batch_size = integer("ROLLOUT_BATCH_SIZE", "16", 1)
    ints = {
        name: integer(name, default, 1)
        for name, default in (
            ("NUM_NODES", "1"),
            ("GPUS_PER_NODE", "8"),
            ("NUM_ROLLOUT", "3000"),
            ("OVER_SAMPLING_BATCH_SIZE", str(2 * rollout_batch_size)),
            ("N_SAMPLES_PER_PROMPT", "8"),
            ("GLOBAL_BATCH_SIZE", "128"),
            ("MAX_RESPONSE_LEN", "32768"),
            ("N_SAMPLES_PER_EVAL_PROMPT", "16"),
            ("EVAL_MAX_RESPONSE_LEN", "16384"),
            ("TP_SIZE", "2"),
            ("MAX_TOKENS_PER_GPU", "18432"),
            ("ROLLOUT_GPUS_PER_ENGINE", "2"),
            ("RAY_PORT", "6379"),
            ("RAY_DASHBOARD_PORT", "8265"),
            ("RAY_WAIT_TIMEOUT", "900"),
            ("RAY_STOP_TIMEOUT", "60"),
            ("RAY_POLL_INTERVAL", "5"),
            ("RAY_STATUS_TIMEOUT", "300"),
            ("MAX_RESTARTS_WITHOUT_PROGRESS", "2"),
        )
    }
    for name, default in (
        ("NODE_RANK", "0"),
        ("CHECKPOINT_GB", "115"),  # one Megatron checkpoint of Qwen3-8B: weights, fp32 master, Adam
        ("EVAL_INTERVAL", "20"),
        ("MAX_RESTARTS", "5"),
        ("RESTART_BACKOFF", "60"),
        ("RESTART_BACKOFF_MAX", "1800"),
        ("WATCHDOG_MINUTES", "180"),
    ):
        ints[name] = integer(name, default, 0)
    # A pilot leaves its first step out of the statistics: it needs at least two more.
    ints["PILOT_STEPS"] = integer("PILOT_STEPS", "8", 3)
    save_interval = integer("SAVE_INTERVAL", "", 1) if get("SAVE_INTERVAL") else None
    numbers = {
        name: as_number(name, get(name, default))
        for name, default in (
            ("ROLLOUT_TEMPERATURE", "1.0"),
            ("SGLANG_MEM_FRACTION", "0.7"),
            ("LR", "1e-6"),
            ("KL_LOSS_COEF", "0"),
            ("ENTROPY_COEF", "0"),
            ("SAVE_HOURS", "2"),
            ("RESTART_WINDOW_HOURS", "24"),
        )
    }
    for name in ("STEP_MINUTES", "GPU_HOUR_PRICE", "RUN_HOURS"):
        numbers[name] = as_number(name, get(name)) if get(name) else ""
    flags = {
        name: as_bool(name, get(name, default))
        for name, default in (
            ("SANDBOX_HOST_NETWORK", "0"),
            ("KILL_STALE", "0"),
            ("REUSE_RAY", "0"),
            ("KEEP_RAY", "0"),
            ("DYNAMIC_SAMPLING", "1"),
            ("PARTIAL_ROLLOUT", "1"),
            ("MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT", "0"),
            ("PILOT_KEEP_CHECKPOINT", "0"),
            ("LAUNCH_CHECKED", "0"),
        )
    }
    has_nvlink = as_bool("HAS_NVLINK", get("HAS_NVLINK")) if get("HAS_NVLINK") else None
    if float(numbers["SAVE_HOURS"]) <= 0:
        raise LaunchError(f"SAVE_HOURS must be > 0, got {numbers['SAVE_HOURS']}")
    keep_checkpoints = _choice("KEEP_CHECKPOINTS", get("KEEP_CHECKPOINTS", "latest"), ("latest", "all"))
    ray_auth = _choice("RAY_AUTH", get("RAY_AUTH", "auto"), ("auto", "on", "off"))
    if flags["MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT"] and not flags["PARTIAL_ROLLOUT"]:
        raise LaunchError("MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT=1 needs PARTIAL_ROLLOUT=1")

    num_nodes, node_rank, gpus = ints["NUM_NODES"], ints["NODE_RANK"], ints["GPUS_PER_NODE"]
    if node_rank >= num_nodes:
        raise LaunchError(f"NODE_RANK ({node_rank}) must be < NUM_NODES ({num_nodes})")
    rollout_prompts, update = rollout_batch_size, ints["GLOBAL_BATCH_SIZE"]
    if num_nodes > 1 and preset == "1x8" and not user_set_batch:
        note(
            f"note: NUM_NODES={num_nodes} keeps the one-node batch ({rollout_prompts} prompts, {update} samples "
            f"per update) on {num_nodes} times the GPUs, most of them idle each step; PRESET=4x8 scales it "
            "(or set ROLLOUT_BATCH_SIZE)"
        )
    total_gpus, tp_size, engine_gpus = num_nodes * gpus, ints["TP_SIZE"], ints["ROLLOUT_GPUS_PER_ENGINE"]
    if gpus % tp_size:
        raise LaunchError(f"GPUS_PER_NODE ({gpus}) must be a multiple of TP_SIZE ({tp_size})")
    if total_gpus % engine_gpus:
        raise LaunchError(
            f"NUM_NODES*GPUS_PER_NODE ({total_gpus}) must be a multiple of ROLLOUT_GPUS_PER_ENGINE ({engine_gpus})"
        )
    data_parallel = total_gpus // tp_size
    if update % data_parallel:
        raise LaunchError(
            f"GLOBAL_BATCH_SIZE ({update}) must be a multiple of the data-parallel size ({data_parallel} = "
            f"{total_gpus} GPUs / TP_SIZE {tp_size})"
        )
    samples = rollout_prompts * ints["N_SAMPLES_PER_PROMPT"]
    if samples % update:
        raise LaunchError(
            f"ROLLOUT_BATCH_SIZE*N_SAMPLES_PER_PROMPT ({samples}) must be a multiple of GLOBAL_BATCH_SIZE ({update})"
        )
    over_sampling = ints["OVER_SAMPLING_BATCH_SIZE"]
    if over_sampling < rollout_prompts:
        raise LaunchError(
            f"OVER_SAMPLING_BATCH_SIZE ({over_sampling}) must be >= ROLLOUT_BATCH_SIZE ({rollout_prompts})"
        )
    if not 0 < float(numbers["SGLANG_MEM_FRACTION"]) < 1:
        raise LaunchError(
            f"SGLANG_MEM_FRACTION must be between 0 and 1, got {numbers['SGLANG_MEM_FRACTION']}"
        )
    router_policy = _choice("ROUTER_POLICY", get("ROUTER_POLICY", "manual"), ROUTER_POLICIES)
    assignment = _choice(
        "ROUTER_ASSIGNMENT_MODE", get("ROUTER_ASSIGNMENT_MODE", "min_load"), ROUTER_ASSIGNMENT_MODES
    )
    correction = _choice("OFF_POLICY_CORRECTION", get("OFF_POLICY_CORRECTION", "tis"), OFF_POLICY_CORRECTIONS)

    # Every node resolves paths on its own and the job runs in another working directory: relative
    # paths would name different files on different nodes.
    run_dir = get("RUN_DIR", f"{save_dir}/run")
    paths = {
        "SLIME_DIR": get("SLIME_DIR", "/root/slime"),
        "MEGATRON_DIR": get("MEGATRON_DIR", "/root/Megatron-LM"),
        "STRANDS_SLIME_DIR": strands_slime_dir,
        "MODEL_DIR": model_dir,
        "HF_CHECKPOINT": get("HF_CHECKPOINT", f"{model_dir}/Qwen3-8B"),
        "REF_LOAD": get("REF_LOAD", f"{model_dir}/Qwen3-8B_torch_dist"),
        "SAVE_DIR": save_dir,
        "DATA_DIR": data_dir,
        "PROMPT_DATA": get("PROMPT_DATA", f"{data_dir}/dapo-math-17k.jsonl"),
        "EVAL_DATA": get("EVAL_DATA", f"{data_dir}/aime-2024.jsonl"),
        # set but empty means none: eval from EVAL_DATA
        "EVAL_CONFIG": environ.get("EVAL_CONFIG", f"{strands_slime_dir}/configs/eval_aime.yaml"),
        "ROLLOUT_CONFIG": get("ROLLOUT_CONFIG", f"{strands_slime_dir}/configs/strands_math.yaml"),
        "RUN_DIR": run_dir,
        # short and node-local: Ray's socket paths under it must stay below the 107-byte AF_UNIX limit
        "RAY_TEMP_DIR": get("RAY_TEMP_DIR", f"/tmp/strands-slime-{os.getuid()}-{ray_port_text}"),
        "PILOT_DIR": pilot_dir,
        "PILOT_JSON": get("PILOT_JSON", f"{pilot_dir}/pilot.json"),
        "RAY_AUTH_TOKEN_FILE": get("RAY_AUTH_TOKEN_FILE", f"{save_dir}/.ray-auth-token"),
        "WANDB_API_KEY_FILE": get("WANDB_API_KEY_FILE"),
    }
    for name, value in paths.items():
        if value and not value.startswith("/"):
            raise LaunchError(f"{name} must be an absolute path (the same on every node), got '{value}'")

    # This node's own address: it binds its Ray node and becomes SLIME_HOST_IP, which slime uses for
    # the router and engines it starts on this node.
    master_addr = get("MASTER_ADDR", "127.0.0.1")
    node_ip = get("NODE_IP")
    if num_nodes > 1 and master_addr in LOOPBACK_ADDRESSES:
        raise LaunchError(
            f"NUM_NODES={num_nodes} needs MASTER_ADDR set to the head node's address that every node can "
            f"reach, got '{master_addr}'"
        )
    if node_rank == 0:
        if node_ip and node_ip != master_addr:
            raise LaunchError(
                f"on rank 0 NODE_IP ({node_ip}) must equal MASTER_ADDR ({master_addr}): the head binds MASTER_ADDR"
            )
        node_ip = master_addr
    elif not node_ip:
        try:
            node_ip = resolve_address(master_addr, ints["RAY_PORT"])
        except OSError as error:
            raise LaunchError(
                f"cannot tell this node's address towards MASTER_ADDR ({master_addr}): {error}; set NODE_IP"
            ) from None
    if node_rank > 0 and node_ip == master_addr:
        raise LaunchError(
            f"NODE_IP ({node_ip}) on rank {node_rank} equals MASTER_ADDR: every node needs its own address"
        )
    wandb_key = get("WANDB_API_KEY") or get("WANDB_KEY")
    if paths["WANDB_API_KEY_FILE"]:
        wandb_key = read_wandb_key_file(paths["WANDB_API_KEY_FILE"])

    return LaunchSettings(
        preset=preset,
        user_set_batch=user_set_batch,
        slime_dir=paths["SLIME_DIR"],
        megatron_dir=paths["MEGATRON_DIR"],
        strands_slime_dir=strands_slime_dir,
        model_dir=model_dir,
        hf_checkpoint=paths["HF_CHECKPOINT"],
        ref_load=paths["REF_LOAD"],
        save_dir=save_dir,
        data_dir=data_dir,
        prompt_data=paths["PROMPT_DATA"],
        eval_data=paths["EVAL_DATA"],
        eval_config=paths["EVAL_CONFIG"],
        rollout_config=paths["ROLLOUT_CONFIG"],
        num_nodes=num_nodes,
        node_rank=node_rank,
        master_addr=master_addr,
        node_ip=node_ip,
        slime_host_ip=environ.get("SLIME_HOST_IP") or node_ip,
        gpus_per_node=gpus,
        ray_port=ints["RAY_PORT"],
        ray_dashboard_port=ints["RAY_DASHBOARD_PORT"],
        ray_dashboard_host=get("RAY_DASHBOARD_HOST", "127.0.0.1"),
        ray_wait_timeout=ints["RAY_WAIT_TIMEOUT"],
        ray_stop_timeout=ints["RAY_STOP_TIMEOUT"],
        ray_poll_interval=ints["RAY_POLL_INTERVAL"],
        ray_status_timeout=ints["RAY_STATUS_TIMEOUT"],
        ray_auth=ray_auth,
        ray_auth_token_file=paths["RAY_AUTH_TOKEN_FILE"],
        ray_node_resources=resources,
        checkpoint_gb=ints["CHECKPOINT_GB"],
        run_dir=run_dir,
        ray_temp_dir=paths["RAY_TEMP_DIR"],
        num_rollout=ints["NUM_ROLLOUT"],
        rollout_batch_size=rollout_prompts,
        over_sampling_batch_size=over_sampling,
        n_samples_per_prompt=ints["N_SAMPLES_PER_PROMPT"],
        global_batch_size=update,
        dynamic_sampling=flags["DYNAMIC_SAMPLING"],
        partial_rollout=flags["PARTIAL_ROLLOUT"],
        mask_offpolicy_in_partial_rollout=flags["MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT"],
        max_response_len=ints["MAX_RESPONSE_LEN"],
        rollout_temperature=numbers["ROLLOUT_TEMPERATURE"],
        eval_interval=ints["EVAL_INTERVAL"],
        n_samples_per_eval_prompt=ints["N_SAMPLES_PER_EVAL_PROMPT"],
        eval_max_response_len=ints["EVAL_MAX_RESPONSE_LEN"],
        save_hours=numbers["SAVE_HOURS"],
        save_interval=save_interval,
        step_minutes=numbers["STEP_MINUTES"],
        keep_checkpoints=keep_checkpoints,
        max_restarts=ints["MAX_RESTARTS"],
        restart_window_hours=numbers["RESTART_WINDOW_HOURS"],
        max_restarts_without_progress=ints["MAX_RESTARTS_WITHOUT_PROGRESS"],
        restart_backoff=ints["RESTART_BACKOFF"],
        restart_backoff_max=ints["RESTART_BACKOFF_MAX"],
        watchdog_minutes=ints["WATCHDOG_MINUTES"],
        pilot=pilot,
        pilot_steps=ints["PILOT_STEPS"],
        pilot_dir=pilot_dir,
        pilot_json=paths["PILOT_JSON"],
        pilot_keep_checkpoint=flags["PILOT_KEEP_CHECKPOINT"],
        gpu_hour_price=numbers["GPU_HOUR_PRICE"],
        run_hours=numbers["RUN_HOURS"],
        tp_size=tp_size,
        max_tokens_per_gpu=ints["MAX_TOKENS_PER_GPU"],
        rollout_gpus_per_engine=engine_gpus,
        sglang_mem_fraction=numbers["SGLANG_MEM_FRACTION"],
        router_policy=router_policy,
        router_assignment_mode=assignment,
        lr=numbers["LR"],
        kl_loss_coef=numbers["KL_LOSS_COEF"],
        entropy_coef=numbers["ENTROPY_COEF"],
        off_policy_correction=correction,
        wandb_api_key=wandb_key,
        wandb_project=get("WANDB_PROJECT", "strands-slime"),
        wandb_group=get("WANDB_GROUP", "qwen3-8b-strands-math"),
        sandbox_host_network=flags["SANDBOX_HOST_NETWORK"],
        kill_stale=flags["KILL_STALE"],
        reuse_ray=flags["REUSE_RAY"],
        keep_ray=flags["KEEP_RAY"],
        launch_checked=flags["LAUNCH_CHECKED"],
        dry_run=dry_run,
        has_nvlink=has_nvlink,
        pythonpath=environ.get("PYTHONPATH", ""),
        extra_train_args=tuple(extra_train_args),
    )
