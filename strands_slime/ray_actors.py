"""What the package's Ray actors share: how they are placed and how their deaths read.

Two parts of the package run on slime's Ray cluster: the episode executor's workers
(:mod:`strands_slime.rollout.executor_ray`) and the sandbox's actor pool
(:mod:`strands_slime.sandbox.ray_backend`). Both ask for resources the same way (a mapping of Ray
resource names: ``CPU``, ``memory`` in bytes, or a custom resource only some nodes have), are never
restarted or retried by Ray behind our back (an episode or a tool call would run twice), and report an
actor's death in a few words. ``ray`` itself is imported by the callers, only where it is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_RESOURCES: dict[str, float] = {"CPU": 1.0}


def one_line(text: Any, limit: int = 400) -> str:
    """``text`` on one line, at most ``limit`` characters (Ray's messages span many)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def actor_options(resources: Mapping[str, float] | None, strategy: str, **extra: Any) -> dict[str, Any]:
    """``ray.remote`` options for an actor asking for ``resources``, placed with ``strategy``: no GPU,
    no restart, no task retry; ``extra`` adds Ray options (concurrency)."""
    wanted = dict(resources if resources is not None else DEFAULT_RESOURCES)
    options: dict[str, Any] = {
        "num_cpus": wanted.pop("CPU", 0.0),
        "num_gpus": 0,
        "max_restarts": 0,
        "max_task_retries": 0,
        "scheduling_strategy": strategy,
        **extra,
    }
    if "memory" in wanted:
        options["memory"] = wanted.pop("memory")
    if wanted:
        options["resources"] = wanted
    return options


def actor_gone_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """The exceptions of ``ray`` that say an actor is gone or unreachable (older releases lack some)."""
    names = ("RayActorError", "ActorUnavailableError")
    return tuple(getattr(ray.exceptions, name) for name in names if hasattr(ray.exceptions, name))


def death_reason(exc: BaseException) -> str:
    """Ray's reason for an actor's death in a few words: ``Ray: its node has died``."""
    for line in str(exc).splitlines():
        line = line.strip()
        for opening in ("The actor is dead because ", "The actor died because "):
            if line.startswith(opening):
                return "Ray: " + one_line(line.removeprefix(opening).split(". ")[0].rstrip("."), 200)
    return f"Ray: {type(exc).__name__}: {one_line(exc, 200)}"
