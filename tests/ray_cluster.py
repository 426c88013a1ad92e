"""A real multi-node Ray cluster on this machine for the Ray backends' tests (``ray`` is a test
dependency: without it the tests that use it skip).

``ray.cluster_utils.Cluster`` starts a head and two more nodes, each its own raylet with 2 logical CPUs,
in this host (custom resources: one ``episode_slot`` on every node, one ``sandbox_slot`` and the label
``pool: rollout`` on each worker node, as labelled node pools would have); this process connects to it as slime's rollout actor is connected to slime's cluster. One
cluster serves a test module (starting one takes ~20 s of this 2-core machine; the test suite forgets
``ray``'s modules after every module that imported them) and is shut down at its end. Tests that remove
a node leave the others (the head stays).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

NODE_CPUS = 2
WORKER_NODES = 2
EPISODE_RESOURCE = "episode_slot"
"""A custom resource every node has one of: actors asking for it land on distinct nodes."""
SANDBOX_RESOURCE = "sandbox_slot"
"""A custom resource only the worker nodes have, one per node (as a CPU-only node pool would be labelled)."""
ROLLOUT_LABEL = {"pool": "rollout"}
"""The Ray label of the worker nodes (``ray start --labels``), as a node pool for the rollout would have."""


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """The running cluster (``cluster.head_node``, ``cluster.worker_nodes``), this process connected."""
    ray = pytest.importorskip("ray", reason="ray (a [dev] test dependency) runs the Ray backends")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": NODE_CPUS,
            "resources": {EPISODE_RESOURCE: 1},
            "include_dashboard": False,
        },
    )
    try:
        # connected while the head is the only node: the driver is attached to the head's raylet (with
        # every node on one IP, Ray 2.47 would pick any of them), so the nodes tests freeze or kill are
        # never this process's own
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
        for _ in range(WORKER_NODES):
            cluster.add_node(
                num_cpus=NODE_CPUS, resources={EPISODE_RESOURCE: 1, SANDBOX_RESOURCE: 1}, labels=ROLLOUT_LABEL
            )
        cluster.wait_for_nodes()
        assert ray.get_runtime_context().get_node_id() == cluster.head_node.node_id
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def node_processes(node: Any) -> list[int]:
    """The pids of a node's raylet and of every process under it (its workers, so its actors)."""
    import psutil
    from ray._private import ray_constants

    raylets = [info.process.pid for info in node.all_processes[ray_constants.PROCESS_TYPE_RAYLET]]
    children = [child.pid for pid in raylets for child in psutil.Process(pid).children(recursive=True)]
    return raylets + children


def node_of(cluster: Any, node_id: str) -> Any:
    """The cluster's node object with this Ray node id (None for an unknown id)."""
    for node in [cluster.head_node, *cluster.worker_nodes]:
        if node.node_id == node_id:
            return node
    return None
