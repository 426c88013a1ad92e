"""Configuration of the Python sandbox (the ``sandbox:`` section of the rollout config)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from strands_slime.ray_actors import RayPlacement
from strands_slime.sandbox.environment import is_secret_name

#: Modules the zygote imports once so that every execution finds them already loaded.
DEFAULT_PRELOAD_MODULES: tuple[str, ...] = ("math", "numpy", "sympy")

#: Largest number of executions one sandbox runs at once (one uid block per sandbox).
MAX_CONCURRENCY_LIMIT = 1024


def default_max_concurrency() -> int:
    """Four executions per core, at least 8: sandbox code is mostly short and CPU-bound."""
    return max(8, min(MAX_CONCURRENCY_LIMIT, 4 * (os.cpu_count() or 1)))


class SandboxConfig(BaseModel):
    """Limits and isolation of ``execute_python_code``; every field has a safe default.

    Limits apply per execution. Isolation features that the kernel or the process's privileges
    do not allow are skipped with a warning (see ``Sandbox.capabilities``) unless ``strict`` is set.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["zygote", "camel", "ray"] = Field(
        default="zygote",
        description="'zygote': pre-started forking worker with isolation; 'camel': camel-ai's "
        "SubprocessInterpreter (no isolation, parity with slime's strands example); 'ray': a pool of "
        "Ray actors on the cluster, each a zygote sandbox (tool calls run apart from the episodes).",
    )
    ray_actors: int = Field(
        default=2,
        ge=1,
        le=4096,
        description="backend ray: sandbox actors per process that runs episodes (slime's rollout "
        "process, or each Ray episode worker).",
    )
    ray_resources: dict[str, float] = Field(
        default_factory=lambda: {"CPU": 1.0},
        description="backend ray: Ray resources of each sandbox actor (CPU, memory in bytes, or a custom "
        "resource only some nodes have).",
    )
    ray_strategy: Literal["SPREAD", "DEFAULT"] = Field(
        default="SPREAD", description="backend ray: Ray's scheduling strategy of the sandbox actors."
    )
    ray_placement: RayPlacement = Field(
        default_factory=RayPlacement,
        description="backend ray: which nodes the sandbox actors may go to (node_labels, avoid_head).",
    )
    ray_same_node: bool = Field(
        default=False,
        description="backend ray: every sandbox actor on the node of the process that calls it (each "
        "episode actor's own node): tool calls never cross the network.",
    )
    timeout_s: float = Field(default=60.0, gt=0, le=86_400, description="Wall-clock limit per execution.")
    cpu_time_s: float | None = Field(
        default=None, gt=0, le=86_400, description="CPU-seconds per process; default: timeout_s."
    )
    memory_mb: int = Field(
        default=1024,
        ge=16,
        description="Address space each process may add on top of the preloaded interpreter (RLIMIT_AS).",
    )
    max_output_bytes: int = Field(
        default=16_384, ge=256, description="Bytes of stdout and of stderr kept and shown (head and tail)."
    )
    output_kill_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="An execution that writes more than this (stdout + stderr) is killed.",
    )
    max_processes: int = Field(
        default=64, ge=1, description="Processes and threads per execution (RLIMIT_NPROC, per-execution uid)."
    )
    max_file_size_mb: int = Field(default=16, ge=1, description="Largest file an execution may write.")
    max_open_files: int = Field(default=256, ge=16, description="Open file descriptors per process.")
    workdir_size_mb: int = Field(
        default=64, ge=1, description="Size of the private tmpfs working directory (mount namespace only)."
    )
    max_code_bytes: int = Field(default=256 * 1024, ge=1, description="Longest code accepted (UTF-8 bytes).")
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        le=MAX_CONCURRENCY_LIMIT,
        description="Executions at once; further calls wait. Default: 4 per core, at least 8.",
    )
    preload_modules: tuple[str, ...] = Field(
        default=DEFAULT_PRELOAD_MODULES,
        description="Imported once by the zygote; modules that are not installed are skipped.",
    )
    zygote_warm_up: str | None = Field(
        default=None,
        description="Code the zygote runs once after preloading, so that lazy imports and first-call "
        "set-up happen before forking. None: a built-in snippet exercising numpy and sympy; '': none.",
    )
    network: Literal["per_call", "shared", "allow"] = Field(
        default="per_call",
        description="'per_call': a fresh empty network namespace per execution; 'shared': one empty "
        "namespace for all executions of this sandbox (cheaper); 'allow': the host network.",
    )
    private_tmp: bool = Field(
        default=True,
        description="Give each execution a private mount namespace: fresh, writable tmpfs mounts of "
        "workdir_size_mb each as /tmp (also the working directory) and as /dev/shm, and read-only "
        "/var/tmp, /run/lock and /var/lock.",
    )
    drop_privileges: bool = Field(
        default=True,
        description="When running as root, run each execution under its own unprivileged uid.",
    )
    uid_base: int = Field(
        default=40_000,
        ge=1_000,
        le=2**31 - 1,
        description="First uid of the blocks of 1024 uids that sandboxes lock and hand to executions.",
    )
    strict: bool = Field(
        default=False,
        description="Fail at start when a requested isolation feature is unavailable, instead of warning.",
    )
    nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="Scheduling niceness of the zygote and executions, so that a saturated sandbox "
        "does not starve the rollout's event loop.",
    )
    prefork: int = Field(
        default=2, ge=0, le=64, description="Idle workers forked ahead of requests (hides fork latency)."
    )
    print_last_expression: bool = Field(
        default=True, description="Print the repr of a final bare expression, as a REPL does."
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment variables for executed code (the zygote backend inherits nothing "
        "else); names that look like credentials are refused.",
    )
    python_executable: str | None = Field(
        default=None, description="Interpreter for the zygote; default: the running interpreter."
    )
    extra_python_path: tuple[str, ...] = Field(
        default=(), description="Directories added to sys.path of executed code."
    )
    workdir_root: str | None = Field(
        default=None,
        description="Parent of per-execution working directories when no mount namespace is available; "
        "default: the system temporary directory.",
    )
    start_timeout_s: float = Field(default=120.0, gt=0, description="Time allowed for the zygote to start.")
    max_restarts: int = Field(
        default=5,
        ge=0,
        description="Consecutive failed zygote (re)starts before executions report infra failure.",
    )

    @field_validator("preload_modules")
    @classmethod
    def _module_names_are_dotted_identifiers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not name or not all(part.isidentifier() for part in name.split(".")):
                raise ValueError(f"preload_modules: {name!r} is not a module name")
        return value

    @field_validator("ray_resources")
    @classmethod
    def _ray_resources_are_amounts(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if not name or name == "GPU":
                raise ValueError(f"ray_resources: {name!r} cannot be asked for (sandbox actors use no GPU)")
            if not 0 <= amount < float("inf"):
                raise ValueError(f"ray_resources: {name} must be a finite amount >= 0, got {amount}")
        return value

    @model_validator(mode="after")
    def _ray_settings_need_the_ray_backend(self) -> SandboxConfig:
        stray = sorted(name for name in self.model_fields_set if name.startswith("ray_"))
        if stray and self.backend != "ray":
            raise ValueError(f"{', '.join(stray)} only apply with backend: ray (backend is {self.backend!r})")
        if self.ray_same_node and self.ray_placement.constrained:
            raise ValueError(
                "ray_same_node puts each sandbox actor on its caller's node: ray_placement cannot also "
                "choose the nodes (set the episode actors' executor.placement instead)"
            )
        return self

    @field_validator("env")
    @classmethod
    def _env_is_well_formed(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not key or "=" in key or "\0" in key or "\0" in item:
                raise ValueError(f"env: invalid variable {key!r}")
        secrets = sorted(key for key in value if is_secret_name(key))
        if secrets:
            raise ValueError(
                f"env: {', '.join(secrets)} would hand a credential to model-written code "
                "(names with KEY, TOKEN, SECRET, PASSWORD, AUTH, ... are refused)"
            )
        return value

    @property
    def effective_cpu_time_s(self) -> float:
        """CPU-seconds per process: ``cpu_time_s``, or ``timeout_s`` when unset."""
        return self.cpu_time_s if self.cpu_time_s is not None else self.timeout_s

    @property
    def effective_max_concurrency(self) -> int:
        """Executions at once: ``max_concurrency``, or 4 per core (at least 8) when unset."""
        return self.max_concurrency if self.max_concurrency is not None else default_max_concurrency()
