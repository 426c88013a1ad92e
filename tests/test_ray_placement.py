"""Placement of the Ray backends' actors, node by node, from a cluster's state (no Ray needed): what fits
where, the sandbox's actors counted, and the one line that says what does not fit."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from strands_slime.config import ConfigError, RolloutConfig
from strands_slime.ray_actors import NodeRoom, RayPlacement
from strands_slime.rollout.executor_ray import check_cluster, plan_placement
from strands_slime.sandbox import SandboxConfig

pytestmark = pytest.mark.unit


def four_nodes() -> list[NodeRoom]:
    """A head and three GPU nodes as slime leaves them: ~118 CPUs free each, two labelled for the rollout."""
    rooms = [NodeRoom("h" * 56, "10.0.0.1", True, {}, {"CPU": 118.0}, {"CPU": 128.0})]
    for index, labels in enumerate(({"pool": "rollout"}, {"pool": "rollout"}, {})):
        node_id = str(index + 2) * 56
        rooms.append(NodeRoom(node_id, f"10.0.0.{index + 2}", False, labels, {"CPU": 118.0}, {"CPU": 128.0}))
    return rooms


def config(**executor: object) -> RolloutConfig:
    sandbox = executor.pop("sandbox", {})
    return RolloutConfig.model_validate({"executor": {"backend": "ray", **executor}, "sandbox": sandbox})


def test_unconstrained_actors_are_counted_per_node_and_left_to_ray() -> None:
    plan = plan_placement(config(workers=130), four_nodes())
    assert plan.nodes == [None] * 130, "Ray's strategy places them"
    with pytest.raises(ConfigError) as caught:
        plan_placement(config(workers=130, resources={"CPU": 4}), four_nodes())
    line = str(caught.value)
    assert "\n" not in line and "room for 116" in line, line
    assert "10.0.0.1 hhhhhhhh (head): room for 29 (CPU 118 free)" in line, line


def test_labels_and_the_head_choose_the_nodes_and_pin_each_actor() -> None:
    placement = {"node_labels": {"pool": "rollout"}, "avoid_head": True}
    plan = plan_placement(config(workers=16, placement=placement), four_nodes())
    assert sorted(set(plan.nodes)) == ["2" * 56, "3" * 56] and plan.nodes.count("2" * 56) == 8, "spread"
    with pytest.raises(ConfigError) as caught:
        plan_placement(config(workers=237, placement=placement), four_nodes())
    line = str(caught.value)
    assert line.startswith("placement: executor.workers=237 episode actors of {CPU: 1} do not fit"), line
    assert "room for 236" in line and "(head): the head, avoided" in line and "no label pool=rollout" in line


def test_sandbox_actors_are_counted_on_their_episode_actors_node() -> None:
    sandbox = {"backend": "ray", "ray_actors": 2, "ray_resources": {"CPU": 1}, "ray_same_node": True}
    placement = {"node_labels": {"pool": "rollout"}}
    plan = plan_placement(config(workers=4, placement=placement, sandbox=sandbox), four_nodes())
    assert len(plan.nodes) == 4 and None not in plan.nodes, "pinned: their sandboxes must fit beside them"
    with pytest.raises(ConfigError) as caught:  # 3 CPUs per episode actor: 39 per labelled node
        plan_placement(config(workers=79, placement=placement, sandbox=sandbox), four_nodes())
    line = str(caught.value)
    assert "each with its 2 sandbox actors of {CPU: 1} on its node" in line and "room for 78" in line, line


def test_the_docs_example_counts_the_sandbox_pool_and_fails_at_once() -> None:
    """docs/training.md's example on a cluster with 64 rollout_cpu: the 128 sandbox actors do not fit."""
    rooms = four_nodes()
    for room in rooms[1:3]:
        room.free["rollout_cpu"] = room.total["rollout_cpu"] = 32.0
    sandbox = {"backend": "ray", "ray_actors": 2, "ray_resources": {"CPU": 1, "rollout_cpu": 1}}
    settings = config(workers=64, resources={"CPU": 0.25, "rollout_cpu": 0.25}, sandbox=sandbox)
    with pytest.raises(ConfigError) as caught:
        plan_placement(settings, rooms)
    line = str(caught.value)
    assert line.startswith("placement: 128 sandbox actors of {CPU: 1, rollout_cpu: 1} (2 per episode actor)")
    assert "room for 48" in line and "\n" not in line, line
    with pytest.raises(
        ConfigError, match=r"^sandbox.ray_resources: no node of the Ray cluster has the resource 'x'"
    ):
        plan_placement(config(workers=1, sandbox={"backend": "ray", "ray_resources": {"x": 1}}), rooms)


def test_placement_settings_are_validated() -> None:
    with pytest.raises(ValidationError, match="placement only apply with backend: ray"):
        RolloutConfig.model_validate({"executor": {"workers": 2, "placement": {"avoid_head": True}}})
    with pytest.raises(ValidationError, match="actor_timeout_s"):
        RolloutConfig.model_validate({"executor": {"backend": "ray", "workers": 2, "actor_timeout_s": 0}})
    with pytest.raises(ValidationError, match="ray_same_node puts each sandbox actor on its caller's node"):
        SandboxConfig(backend="ray", ray_same_node=True, ray_placement=RayPlacement(avoid_head=True))
    with pytest.raises(ValidationError, match="node_labels"):
        RolloutConfig.model_validate(
            {"executor": {"backend": "ray", "workers": 1, "placement": {"node_labels": {" x": "y"}}}}
        )
    ray = config(workers=2).executor
    assert ray.actor_timeout_s == 5.0 and ray.placement == RayPlacement() and ray.log_to_driver is True


def test_the_old_cluster_check_still_works_and_says_where_it_went() -> None:
    nodes = [
        {"NodeID": "a" * 56, "Alive": True, "Resources": {"CPU": 2.0}},
        {"NodeID": "b" * 56, "Alive": False},
    ]
    settings = config(workers=3).executor
    with (
        pytest.warns(DeprecationWarning, match="use plan_placement"),
        pytest.raises(ConfigError, match="room for 2"),
    ):
        check_cluster(settings, nodes, {"CPU": 2.0})
