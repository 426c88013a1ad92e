"""What the package's Ray actors share: how they are placed and how their deaths read.

The episode executor's workers (:mod:`strands_slime.rollout.executor_ray`) and the sandbox's actor
pool (:mod:`strands_slime.sandbox.ray_backend`) ask for resources the same way, are never restarted or
retried by Ray behind our back (an episode or a tool call would run twice), and are placed the same
way: :class:`RayPlacement` over :func:`cluster_rooms`, pinned with :func:`pinned_to`. ``ray`` itself is
imported by the callers, only where it is used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_RESOURCES: dict[str, float] = {"CPU": 1.0}
HEAD_RESOURCE = "node:__internal_head__"
"""The resource Ray gives the head node only: how a node is known to be the head."""


class RayPlacement(BaseModel):
    """Which nodes of the cluster an actor may go to, beyond the resources it asks for: nodes with these
    Ray labels (``ray start --labels``), and not the head node (where slime's driver, its rollout manager
    and often an SGLang engine run). Unset fields leave the choice to Ray's ``strategy``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_labels: dict[str, str] = Field(
        default_factory=dict,
        description='Only nodes whose Ray labels have these values (ray start --labels \'{"pool": "rollout"}\').',
    )
    avoid_head: bool = Field(False, description="Never the head node of the Ray cluster.")

    @field_validator("node_labels")
    @classmethod
    def _labels_are_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key or key != key.strip():
                raise ValueError(f"node_labels: {key!r} is not a label name")
        return value

    @property
    def constrained(self) -> bool:
        """Whether the nodes are chosen by us (pinned) rather than by Ray's strategy."""
        return bool(self.node_labels) or self.avoid_head


@dataclasses.dataclass
class NodeRoom:
    """One live node of the cluster as placement sees it: who it is and what is free on it now."""

    node_id: str
    ip: str
    head: bool
    labels: dict[str, str]
    free: dict[str, float]
    total: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        """``10.0.0.3 5e6f7a8b (head)``: how a node is named in messages."""
        return f"{self.ip} {self.node_id[:8]}" + (" (head)" if self.head else "")

    def refusal(self, placement: RayPlacement) -> str | None:
        """Why ``placement`` excludes this node (None: it may be used)."""
        if placement.avoid_head and self.head:
            return "the head, avoided"
        wrong = [f"{k}={v}" for k, v in placement.node_labels.items() if self.labels.get(k) != v]
        return f"no label {', '.join(wrong)}" if wrong else None

    def fits(self, need: Mapping[str, float]) -> int:
        """How many actors needing ``need`` fit in what is free here (a large number when they need nothing)."""
        amounts = [
            int(self.free.get(name, 0.0) // amount + 1e-9) for name, amount in need.items() if amount > 0
        ]
        return min(amounts, default=1 << 30)

    def take(self, need: Mapping[str, float], count: int = 1) -> None:
        """Count ``count`` actors needing ``need`` as placed here."""
        for name, amount in need.items():
            self.free[name] = self.free.get(name, 0.0) - amount * count


def cluster_rooms(ray: Any) -> list[NodeRoom]:
    """Every live node with its free resources, from the cluster's state service (blocking)."""
    from ray._private import state

    available: Mapping[str, Mapping[str, float]] = state.available_resources_per_node()
    rooms = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        node_id = node["NodeID"]
        rooms.append(
            NodeRoom(
                node_id=node_id,
                ip=str(node.get("NodeManagerAddress", "?")),
                head=HEAD_RESOURCE in node.get("Resources", {}),
                labels={str(k): str(v) for k, v in (node.get("Labels") or {}).items()},
                free={k: float(v) for k, v in available.get(node_id, {}).items()},
                total={k: float(v) for k, v in node.get("Resources", {}).items()},
            )
        )
    return rooms


def pick_room(rooms: list[NodeRoom], need: Mapping[str, float], placement: RayPlacement) -> NodeRoom | None:
    """The allowed node with the most room for ``need`` (spreads actors as SPREAD would), or None."""
    allowed = [room for room in rooms if room.refusal(placement) is None and room.fits(need) >= 1]
    return max(allowed, key=lambda room: (room.fits(need), not room.head), default=None)


def pinned_to(node_id: str) -> Any:
    """A strategy that places an actor on that node or nowhere (Ray's hard node affinity)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def one_line(text: Any, limit: int = 400) -> str:
    """``text`` on one line, at most ``limit`` characters (Ray's messages span many)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def actor_options(resources: Mapping[str, float] | None, strategy: Any, **extra: Any) -> dict[str, Any]:
    """``ray.remote`` options for an actor asking for ``resources``, placed with ``strategy`` (a name, or
    :func:`pinned_to` a node): no GPU,
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


def actor_unreachable_error(ray: Any) -> tuple[type[BaseException], ...]:
    """The exception of ``ray`` that says an actor could not be reached *for now* (a network error, a
    node not yet declared dead): the actor may still be alive, so it is not a death by itself."""
    found = getattr(ray.exceptions, "ActorUnavailableError", None)
    return (found,) if found is not None else ()


def death_reason(exc: BaseException) -> str:
    """Ray's reason for an actor's death in a few words: ``Ray: its node has died``."""
    for line in str(exc).splitlines():
        line = line.strip()
        for opening in ("The actor is dead because ", "The actor died because "):
            if line.startswith(opening):
                return "Ray: " + one_line(line.removeprefix(opening).split(". ")[0].rstrip("."), 200)
    return f"Ray: {type(exc).__name__}: {one_line(exc, 200)}"
