"""One node's launch plan: the settings and inputs checked, then every command this node will run (its Ray
node, the job's ``train.py``, the supervisor, the pilot's sampler and analysis) and the job's runtime env.

``scripts/strands_qwen3_8b.sh`` runs ``python3 -m strands_slime.launch [--dry-run] [--pilot] [--foreground]
[-- TRAIN_PY_FLAGS]``: a refusal is one ``error:`` line and exit 1; ``--help`` and ``--dry-run`` print
and end there; otherwise the plan is written to ``--plan-fd`` as bash assignments the script evaluates
before it starts Ray, detaches and supervises (what stays in bash: processes, signals and PID files).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from strands_slime.launch.checkpoints import job_steps, room_checks, save_cadence
from strands_slime.launch.inputs import (
    EvalSettings,
    Problems,
    check_hf_checkpoint,
    check_inputs,
    check_rollout_config,
    model_args,
)
from strands_slime.launch.settings import LaunchError, LaunchSettings, read_settings
from strands_slime.launch.train_command import checkpoint_dir, router_args, tensorboard_dir, train_command
from strands_slime.launch.usage import USAGE

RAY_AUTH_MIN_VERSION = (2, 52, 0)
# Cluster-wide W&B options for the job's runtime env. Node-specific settings (SLIME_HOST_IP, NCCL's
# interfaces, HF_HOME, proxies), the W&B key and Ray's auth token reach each node's Ray processes through
# the environment of that node's `ray start`, never the job's runtime env: that would give every node
# the head's values, and Ray shows runtime envs on its dashboard and in its logs.
RUNTIME_ENV_PASSTHROUGH = ("WANDB_MODE", "WANDB_BASE_URL", "WANDB_ENTITY")
PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")


@dataclass(frozen=True)
class LaunchPlan:
    """What this node runs, resolved from its settings."""

    settings: LaunchSettings
    evaluation: EvalSettings
    save_interval: int
    ray_version: str
    ray_auth: bool
    train: list[str]
    ray_node: list[str]
    """``ray start ... --block``: the head on rank 0, a worker elsewhere."""
    submit: list[str]
    supervisor: list[str]
    sampler: list[str]
    analyze: list[str]
    preflight: list[str]
    runtime_env: dict[str, dict[str, str]]
    proxy_bypass: dict[str, str]
    """``no_proxy`` and ``NO_PROXY`` with the cluster's addresses added, when a proxy is set (else empty)."""

    @property
    def head_marker(self) -> str:
        """The file in SAVE_DIR by which workers see that they share it with this run's head."""
        return f"{self.settings.save_dir}/.strands-slime-head"

    @property
    def log_file(self) -> str:
        """The detached launcher's log."""
        return f"{self.settings.node_dir}/launch.log"


def ray_version(environ: Mapping[str, str]) -> str:
    """The installed ``ray`` CLI's version (``x.y.z``), or "" when there is none."""
    try:
        result = subprocess.run(
            ["ray", "--version"], capture_output=True, text=True, timeout=120, check=False, env=dict(environ)
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    found = re.search(r"[0-9]+\.[0-9]+\.[0-9]+", result.stdout)
    return found.group(0) if found else ""


def ray_auth_enabled(setting: str, version: str, note: Callable[[str], None]) -> bool:
    """Ray token authentication (Ray >= 2.52): every Ray process, CLI call and API client of the cluster
    presents the token. ``auto`` turns it on where the installed Ray has it.

    Raises:
        LaunchError: ``RAY_AUTH=on`` with a Ray that lacks it.
    """
    supported = bool(version) and tuple(int(part) for part in version.split(".")) >= RAY_AUTH_MIN_VERSION
    if setting == "off" or (setting == "auto" and not supported):
        note(
            f"note: Ray token authentication is off (RAY_AUTH={setting}, Ray {version or 'unknown'}; it needs "
            "2.52+): anyone who reaches the cluster's ports can run code on it; see docs/training.md, Exposure"
        )
        return False
    if not supported:
        raise LaunchError(
            f"RAY_AUTH=on needs Ray 2.52 or newer for token authentication; this node has Ray {version or 'unknown'}"
        )
    return True


def nvlink(settings: LaunchSettings, environ: Mapping[str, str]) -> bool:
    """Whether the GPUs are linked by NVLink (then NCCL's NVLS may be used); ``HAS_NVLINK`` overrides."""
    if settings.has_nvlink is not None:
        return settings.has_nvlink
    if shutil.which("nvidia-smi", path=environ.get("PATH")) is None:
        return False
    try:
        result = subprocess.run(
            ["nvidia-smi", "topo", "-m"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=dict(environ),
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return re.search(r"NV[0-9]+", result.stdout) is not None


def runtime_env(settings: LaunchSettings, environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The job's Ray runtime env: paths and cluster-wide settings only, never a secret."""
    pythonpath = ":".join(
        part
        for part in (
            settings.megatron_dir,
            settings.slime_dir,
            settings.strands_slime_dir,
            settings.pythonpath,
        )
        if part
    )
    env_vars = {
        "PYTHONPATH": pythonpath,
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_NVLS_ENABLE": "1" if nvlink(settings, environ) else "0",
        "PYTHONUNBUFFERED": "1",
        "STRANDS_SLIME_CONFIG": settings.rollout_config,
        "DATA_DIR": settings.data_dir,
        "TENSORBOARD_DIR": tensorboard_dir(settings),
    }
    env_vars.update({name: environ[name] for name in RUNTIME_ENV_PASSTHROUGH if environ.get(name)})
    return {"env_vars": env_vars}


def _options(options: Mapping[str, object]) -> list[str]:
    """``--flag value`` pairs, in order."""
    return [token for flag, value in options.items() for token in (flag, str(value))]


def ray_node_command(settings: LaunchSettings) -> list[str]:
    """``ray start ... --block`` for this node. Ray's ports are pinned so a network rule can name them
    (docs/training.md, "Exposure"), derived from RAY_PORT so two clusters on a machine do not collide."""
    port = settings.ray_port
    resources = {"--resources": settings.ray_node_resources} if settings.ray_node_resources else {}
    node = {"--temp-dir": settings.ray_temp_dir, "--num-gpus": settings.gpus_per_node}
    if settings.node_rank == 0:
        role = [
            *("--head", *_options({"--node-ip-address": settings.node_ip, "--port": port, **node})),
            *("--disable-usage-stats", *_options({"--ray-client-server-port": port + 7, **resources})),
            *_options(
                {
                    "--dashboard-host": settings.ray_dashboard_host,
                    "--dashboard-port": settings.ray_dashboard_port,
                }
            ),
        ]
    else:
        head = {"--address": f"{settings.master_addr}:{port}", "--node-ip-address": settings.node_ip}
        role = [*_options({**head, **node}), "--disable-usage-stats", *_options(resources)]
    ports = {
        "--node-manager-port": port + 1,
        "--object-manager-port": port + 2,
        "--runtime-env-agent-port": port + 3,
        "--dashboard-agent-grpc-port": port + 4,
        "--metrics-export-port": port + 5,
        "--dashboard-agent-listen-port": port + 6,
        "--min-worker-port": 10002,
        "--max-worker-port": 19999,
    }
    return ["ray", "start", *role, *_options(ports), "--block"]


def supervisor_command(settings: LaunchSettings, save_interval: int) -> list[str]:
    """The supervisor (:mod:`strands_slime.launch.supervisor`) of the job; the script adds the runtime env
    file, the head it may restart and, after ``--``, the train command."""
    options = {
        "--state-file": f"{settings.node_dir}/state.json",
        "--node-dir": settings.node_dir,
        "--checkpoint-dir": checkpoint_dir(settings),
        "--save-dir": settings.save_dir,
        "--address": f"http://127.0.0.1:{settings.ray_dashboard_port}",
        "--gcs-address": f"{settings.master_addr}:{settings.ray_port}",
        "--job-steps": job_steps(settings),
        "--save-interval": save_interval,
        "--nodes": settings.num_nodes,
        "--gpus": settings.total_gpus,
        "--max-restarts": settings.max_restarts,
        "--restart-window-hours": settings.restart_window_hours,
        "--max-restarts-without-progress": settings.max_restarts_without_progress,
        "--restart-backoff": settings.restart_backoff,
        "--restart-backoff-max": settings.restart_backoff_max,
        "--watchdog-seconds": settings.watchdog_minutes * 60,
        "--poll-interval": settings.ray_poll_interval,
        "--status-timeout": settings.ray_status_timeout,
        "--node-wait-timeout": settings.ray_wait_timeout,
        "--checkpoint-gb": settings.checkpoint_gb,
    }
    command = ["python3", "-m", "strands_slime.launch.supervisor", "run", *_options(options)]
    if settings.pilot:
        command.append("--pilot")
    # Megatron keeps every checkpoint whose iteration is a multiple of --save-retain-interval, and 0 is
    # one: with SAVE_INTERVAL=1 the first save (iteration 0) would stay forever.
    if settings.keep_checkpoints == "latest" and save_interval == 1:
        command.append("--remove-first-checkpoint")
    return command


def pilot_settings(settings: LaunchSettings) -> dict[str, str]:
    """Settings that decide a step's time: a pilot.json measured under others does not size this run."""
    return {
        "NUM_NODES": str(settings.num_nodes),
        "GPUS_PER_NODE": str(settings.gpus_per_node),
        "ROLLOUT_BATCH_SIZE": str(settings.rollout_batch_size),
        "OVER_SAMPLING_BATCH_SIZE": str(settings.over_sampling_batch_size),
        "N_SAMPLES_PER_PROMPT": str(settings.n_samples_per_prompt),
        "GLOBAL_BATCH_SIZE": str(settings.global_batch_size),
        "MAX_RESPONSE_LEN": str(settings.max_response_len),
        "TP_SIZE": str(settings.tp_size),
        "ROLLOUT_GPUS_PER_ENGINE": str(settings.rollout_gpus_per_engine),
        "MAX_TOKENS_PER_GPU": str(settings.max_tokens_per_gpu),
        "SGLANG_MEM_FRACTION": settings.sglang_mem_fraction,
        "PARTIAL_ROLLOUT": "1" if settings.partial_rollout else "0",
        "DYNAMIC_SAMPLING": "1" if settings.dynamic_sampling else "0",
        "OFF_POLICY_CORRECTION": settings.off_policy_correction,
        "EXTRA_TRAIN_ARGS": " ".join(settings.extra_train_args),
    }


def analyze_command(settings: LaunchSettings, evaluation: EvalSettings) -> list[str]:
    """The pilot's measurement and projection of the full run (:mod:`strands_slime.launch.pilot`); the
    script adds ``--log`` (the job's log) and ``--gpu-samples``."""
    options: dict[str, object] = {
        "--out": settings.pilot_dir,
        "--tensorboard": tensorboard_dir(settings),
        "--checkpoint-dir": checkpoint_dir(settings),
        "--num-rollout": settings.num_rollout,
        "--gpus": settings.total_gpus,
        "--nodes": settings.num_nodes,
        "--retain": settings.keep_checkpoints,
        "--checkpoint-gb": settings.checkpoint_gb,
        "--max-hours-at-risk": settings.save_hours,
        "--max-tokens-per-gpu": settings.max_tokens_per_gpu,
    }
    if settings.gpu_hour_price:
        options["--gpu-hour-price"] = settings.gpu_hour_price
    if settings.run_hours:
        options["--run-hours"] = settings.run_hours
    if settings.eval_interval > 0:
        options |= {
            "--eval-interval": settings.eval_interval,
            "--eval-prompts": evaluation.prompts,
            "--eval-samples-per-prompt": evaluation.n_samples,
            "--eval-max-response-len": evaluation.max_response_len,
        }
    settings_recorded = [f"--setting={name}={value}" for name, value in pilot_settings(settings).items()]
    return ["python3", "-m", "strands_slime.launch.pilot", "analyze", *_options(options), *settings_recorded]


def preflight_args(settings: LaunchSettings) -> list[str]:
    """This node's preflight (:mod:`strands_slime.launch.preflight`): GPUs, the router's acceptance of our
    options, writable shared folders, the sandbox's isolation."""
    args = [
        "--gpus",
        str(settings.gpus_per_node),
        *(f"--router-arg={token}" for token in router_args(settings)),
    ]
    if settings.dry_run:
        return args
    args += [
        "--writable",
        settings.save_dir,
        "--writable",
        settings.run_dir,
        "--sandbox-config",
        settings.rollout_config,
    ]
    if settings.sandbox_host_network:
        args.append("--allow-host-network")
    if settings.pilot:
        args += ["--writable", settings.pilot_dir]
    return args


def build_plan(
    settings: LaunchSettings, environ: Mapping[str, str], *, script: Path, note: Callable[[str], None]
) -> LaunchPlan:
    """Check every input and build every command of this node's launch.

    Raises:
        LaunchError: a check failed (a real run lists every missing input at once).
    """
    problems = Problems(settings.dry_run, note)
    evaluation = check_inputs(settings, problems, environ.get("PATH"))
    wanted = pilot_settings(settings)
    cadence = save_cadence(settings, wanted)
    if cadence.why:
        note(cadence.why)
    if cadence.problem:
        problems.add(cadence.problem)
        if settings.dry_run:
            note("note (dry run): the command below saves every step in place of a sized SAVE_INTERVAL")
    room_problems, room_notes = room_checks(settings, cadence.interval)
    for line in room_notes:
        note(line)
    for problem in room_problems:
        problems.add(problem)
    problems.finish()
    # The detached launcher skips what its parent checked a moment ago (importing math-verify takes seconds).
    if not settings.launch_checked and Path(settings.rollout_config).is_file():
        if Path(settings.strands_slime_dir, "strands_slime").is_dir():
            check_rollout_config(settings, note)
    repo = script.resolve().parent.parent
    model = model_args(repo / "configs" / "qwen3_8b_model.sh")
    if not settings.dry_run and not settings.launch_checked:
        check_hf_checkpoint(repo / "scripts" / "lib" / "check_hf_config.py", settings.hf_checkpoint, model)
    train = train_command(settings, model, evaluation, cadence.interval)
    dashboard = f"http://127.0.0.1:{settings.ray_dashboard_port}"
    proxy_bypass: dict[str, str] = {}
    if any(environ.get(name) for name in PROXY_VARIABLES):
        direct = f"127.0.0.1,localhost,{settings.node_ip},{settings.master_addr}"
        proxy_bypass = {
            name: f"{environ[name]},{direct}" if environ.get(name) else direct
            for name in ("no_proxy", "NO_PROXY")
        }
        note(
            f"a proxy is set: {direct} added to no_proxy (add the other nodes' addresses too, see docs/training.md)"
        )
    version = ray_version(environ)
    return LaunchPlan(
        settings=settings,
        evaluation=evaluation,
        save_interval=cadence.interval,
        ray_version=version,
        ray_auth=ray_auth_enabled(settings.ray_auth, version, note),
        train=train,
        ray_node=ray_node_command(settings),
        submit=["ray", "job", "submit", "--address", dashboard, "--submission-id", "JOB_ID", "--no-wait"],
        supervisor=supervisor_command(settings, cadence.interval),
        sampler=[
            *("python3", "-m", "strands_slime.launch.gpu_sampler", "--out"),
            *(f"{settings.pilot_dir}/gpu-node{settings.node_rank}.jsonl", "--node", str(settings.node_rank)),
            *("--interval", "2"),
        ],
        analyze=analyze_command(settings, evaluation),
        preflight=preflight_args(settings),
        runtime_env=runtime_env(settings, environ),
        proxy_bypass=proxy_bypass,
    )


def _cmd(command: Sequence[str]) -> str:
    """A command as one shell-quoted line, so it can be copied or parsed with shlex."""
    return "+ " + shlex.join(command)


def dry_run_lines(
    plan: LaunchPlan, *, script: Path, foreground: bool, detached_args: Sequence[str]
) -> list[str]:
    """What a dry run prints after its checks: this node's part of the launch, in the order it would run."""
    s = plan.settings
    lines = [
        f"# this node (rank {s.node_rank}): NODE_IP={s.node_ip}, SLIME_HOST_IP={s.slime_host_ip} in the "
        f"environment of ray start{', with WANDB_API_KEY (not printed)' if s.wandb_api_key else ''}",
        f"# run state and logs: {s.node_dir}; Ray temp dir: {s.ray_temp_dir}",
    ]
    if not foreground:
        detach = ["env", "LAUNCH_CHECKED=1", "setsid", "bash", str(script), *detached_args]
        lines += [
            "# checks passed; the launcher now detaches (a closed terminal does not stop it; --foreground stays attached):",
            f"#   {shlex.join(detach)} > {shlex.quote(plan.log_file)}",
        ]
    if s.kill_stale:
        lines.append(
            f"# KILL_STALE=1: first stop the launcher and Ray node recorded in {s.node_dir}, if still running"
        )
    auth = (
        [
            f"# Ray token authentication: on (Ray {plan.ray_version}); token in {s.ray_auth_token_file} (mode 600, written by the head)"
        ]
        if plan.ray_auth
        else []
    )
    sampler = [_cmd(plan.sampler)] if s.pilot else []
    if s.node_rank > 0:
        return [
            *lines,
            f"# SAVE_DIR check: {plan.head_marker} must appear here, written by the head within RAY_WAIT_TIMEOUT",
            *auth,
            f"# wait for the Ray head at {s.master_addr}:{s.ray_port} (up to {s.ray_wait_timeout}s), then check this node against the head",
            *sampler,
            _cmd(plan.ray_node),
        ]
    lines += auth
    if s.pilot:
        lines.append(
            f"# pilot: {s.pilot_dir} starts empty (an earlier pilot there is moved to {s.pilot_dir}.<time>)"
        )
    if s.num_nodes > 1:
        lines.append(f"# SAVE_DIR check: write {plan.head_marker} for the workers to find")
    lines += [
        _cmd(plan.ray_node),
        *sampler,
        "# runtime-env (written to a private file in RUN_DIR):",
        *(f"#   {line}" for line in json.dumps(plan.runtime_env, indent=2).splitlines()),
        f"# the supervisor waits until {s.num_nodes} nodes with {s.total_gpus} GPUs in all have joined "
        f"(up to {s.ray_wait_timeout}s), then submits, each attempt:",
        _cmd([*plan.submit, "--runtime-env", "RUNTIME_ENV_FILE", "--", *plan.train]),
        "# and supervises it with:",
        _cmd([*plan.supervisor, "--runtime-env", "RUNTIME_ENV_FILE", "--", "TRAIN_CMD"]),
    ]
    if s.pilot:
        lines += [
            "# after the pilot: stop the GPU samplers, then measure and project:",
            _cmd(
                [
                    *plan.analyze,
                    "--log",
                    f"{s.node_dir}/job-JOB_ID.log",
                    "--gpu-samples",
                    f"{s.pilot_dir}/gpu-node*.jsonl",
                ]
            ),
        ]
    return lines


def _bash(name: str, value: str | int | bool | Sequence[str]) -> str:
    if isinstance(value, bool):
        return f"{name}={int(value)}"
    if isinstance(value, (str, int)):
        return f"{name}={shlex.quote(str(value))}"
    return f"{name}=({' '.join(shlex.quote(token) for token in value)})"


def shell_assignments(plan: LaunchPlan, *, foreground: bool, detached_args: Sequence[str]) -> str:
    """The plan as bash assignments for the script's ``eval``: the values its process handling needs."""
    s = plan.settings
    values: dict[str, str | int | bool | Sequence[str]] = {
        "LAUNCH": "run",
        "FOREGROUND": foreground,
        "DETACHED_ARGS": detached_args,
        "NODE_RANK": s.node_rank,
        "NUM_NODES": s.num_nodes,
        "NODE_IP": s.node_ip,
        "MASTER_ADDR": s.master_addr,
        "RAY_PORT": s.ray_port,
        "RAY_DASHBOARD_PORT": s.ray_dashboard_port,
        "RAY_DASHBOARD_HOST": s.ray_dashboard_host,
        "RAY_WAIT_TIMEOUT": s.ray_wait_timeout,
        "RAY_STOP_TIMEOUT": s.ray_stop_timeout,
        "RAY_POLL_INTERVAL": s.ray_poll_interval,
        "RAY_STATUS_TIMEOUT": s.ray_status_timeout,
        "MAX_RESTARTS": s.max_restarts,
        "KILL_STALE": s.kill_stale,
        "REUSE_RAY": s.reuse_ray,
        "KEEP_RAY": s.keep_ray,
        "LAUNCH_CHECKED": s.launch_checked,
        "PILOT": s.pilot,
        "PILOT_KEEP_CHECKPOINT": s.pilot_keep_checkpoint,
        "SAVE_DIR": s.save_dir,
        "RUN_DIR": s.run_dir,
        "NODE_DIR": s.node_dir,
        "PILOT_DIR": s.pilot_dir,
        "PILOT_JSON": s.pilot_json,
        "CHECKPOINT_DIR": checkpoint_dir(s),
        "RAY_AUTH_TOKEN_FILE": s.ray_auth_token_file,
        "RAY_AUTH_ENABLED": plan.ray_auth,
        "RAY_VERSION": plan.ray_version or "unknown",
        "HEAD_MARKER": plan.head_marker,
        "LOG_FILE": plan.log_file,
        "RAY_NODE_CMD": plan.ray_node,
        "TRAIN_CMD": plan.train,
        "SUBMIT_CMD": plan.submit,
        "SUPERVISOR_CMD": plan.supervisor,
        "SAMPLER_CMD": plan.sampler,
        "ANALYZE_CMD": plan.analyze,
        "PREFLIGHT_ARGS": plan.preflight,
        "RUNTIME_ENV": json.dumps(plan.runtime_env, indent=2),
        "HAS_WANDB": bool(s.wandb_api_key),
    }
    lines = [_bash(name, value) for name, value in values.items()]
    # Node-specific settings reach this node's Ray processes through the environment of `ray start`.
    lines.append(f"export {_bash('SLIME_HOST_IP', s.slime_host_ip)}")
    if s.wandb_api_key:
        lines.append(f"export {_bash('WANDB_API_KEY', s.wandb_api_key)}")
    lines += [f"export {_bash(name, value)}" for name, value in plan.proxy_bypass.items()]
    return "\n".join(lines) + "\n"


def _internal_options(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The script's own options (``--script``, ``--pythonpath``, ``--plan-fd``), then the user's arguments."""
    internal: dict[str, str] = {}
    args = list(argv)
    while len(args) >= 2 and args[0] in ("--script", "--pythonpath", "--plan-fd") and args[0] not in internal:
        internal[args[0]] = args[1]
        args = args[2:]
    return internal, args


def _user_arguments(args: Sequence[str]) -> tuple[set[str], list[str]]:
    """(the user's switches, the train.py flags after ``--``)."""
    switches: set[str] = set()
    for index, arg in enumerate(args):
        if arg == "--":
            return switches, list(args[index + 1 :])
        if arg not in ("--dry-run", "--foreground", "--pilot", "-h", "--help"):
            raise LaunchError(f"unknown argument '{arg}' (see --help; train.py flags go after --)")
        switches.add(arg)
    return switches, []


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Check and plan this node's launch; print it (``--dry-run``), or hand it to the script."""
    environ = dict(os.environ if environ is None else environ)
    script_default = Path(__file__).resolve().parents[2] / "scripts" / "strands_qwen3_8b.sh"
    internal, args = _internal_options(sys.argv[1:] if argv is None else argv)
    script = Path(internal.get("--script", script_default))

    def log(message: str) -> None:
        print(f"[{script.name}] {message}", file=sys.stderr, flush=True)

    try:
        switches, extra = _user_arguments(args)
        if "--pythonpath" in internal:
            environ["PYTHONPATH"] = internal["--pythonpath"]
        if switches & {"-h", "--help"}:
            print(USAGE, end="", flush=True)
            return _hand_over(internal, "LAUNCH=done\n")
        foreground = "--foreground" in switches
        settings = read_settings(
            environ,
            repo_root=script.resolve().parent.parent,
            pilot="--pilot" in switches,
            dry_run="--dry-run" in switches,
            extra_train_args=extra,
            note=log,
        )
        plan = build_plan(settings, environ, script=script, note=log)
        detached = ["--foreground", *(["--", *extra] if extra else [])]
        if settings.dry_run:
            # the preflight as notes (a dry run may happen away from the GPU box, and creates no folder)
            _preflight_notes(plan)
            if settings.node_rank > 0:
                head = f"{settings.master_addr}:{settings.ray_port}"
                log(
                    f"rank {settings.node_rank} of {settings.num_nodes} ({settings.node_ip}): joining the Ray head at {head} as a worker"
                )
            print(
                "\n".join(dry_run_lines(plan, script=script, foreground=foreground, detached_args=detached)),
                flush=True,
            )
            return _hand_over(internal, "LAUNCH=done\n")
        return _hand_over(internal, shell_assignments(plan, foreground=foreground, detached_args=detached))
    except LaunchError as error:
        log(f"error: {error}")
        return 1


def _preflight_notes(plan: LaunchPlan) -> None:
    """This node's preflight in this process, its problems printed as notes (and its verdict dropped)."""
    from strands_slime.launch import preflight

    with contextlib.redirect_stdout(io.StringIO()):
        preflight.main([*plan.preflight, "--notes-only"])


def _hand_over(internal: Mapping[str, str], text: str) -> int:
    """Write the plan to the script's ``--plan-fd`` (none: a person ran this module, nothing to hand)."""
    if "--plan-fd" in internal:
        with os.fdopen(int(internal["--plan-fd"]), "w") as out:
            out.write(text)
    return 0
