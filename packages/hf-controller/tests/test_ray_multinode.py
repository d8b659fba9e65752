"""Pools over a real two-node Ray cluster: one node per entry, rank order, refusals up front."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hf_controller import (
    ConfigurationError,
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    cluster_nodes,
    ensure_ray,
    register,
)
from hf_controller.ray.cluster import started_local_ray
from hf_controller.testing import local_multinode_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two local nodes of 2 CPUs; the session's local Ray comes back afterwards."""
    import ray

    was_running = ray.is_initialized()
    with local_multinode_cluster([2, 2]) as nodes:
        yield nodes
    if was_running:  # later modules of the session expect the conftest's local Ray
        ensure_ray(num_cpus=4, log_to_driver=False)


class NodeWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def where(self) -> tuple[int, str, str, str, str]:
        import ray

        env = os.environ
        node = ray.get_runtime_context().get_node_id()
        return self.rank, node, env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["MASTER_ADDR"]


def _placement_groups() -> set[str]:
    from ray.util.placement_group import placement_group_table

    return {pg_id for pg_id, pg in placement_group_table().items() if pg["state"] != "REMOVED"}


@pytest.mark.parametrize("layout", [[1, 1], [2, 1]])
def test_each_entry_gets_its_own_node_in_rank_order(cluster: Any, layout: list[int]) -> None:
    pool = RayResourcePool(layout, use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(NodeWorker))
    try:
        rows = group.where()
        first, second = pool.node_ids()
        assert first != second
        expected_nodes = [first] * layout[0] + [second] * layout[1]
        assert [row[0] for row in rows] == list(range(sum(layout)))
        assert [row[1] for row in rows] == expected_nodes
        assert [row[2] for row in rows] == [str(i) for n in layout for i in range(n)]
        assert [row[3] for row in rows] == [str(n) for n in layout for _ in range(n)]
        addresses = {node.node_id: node.address for node in cluster_nodes()}
        assert {row[4] for row in rows} == {addresses[first]}  # MASTER_ADDR: rank 0's node
    finally:
        group.kill()
        pool.release()


def test_cluster_nodes_sees_every_node_and_reservations(cluster: Any) -> None:
    import ray

    nodes = cluster_nodes()
    assert len(nodes) == 2 and len({n.node_id for n in nodes}) == 2
    assert nodes[0].node_id == ray.get_runtime_context().get_node_id()  # the driver's first
    assert [(n.cpus, n.gpus) for n in nodes] == [(2.0, 0.0), (2.0, 0.0)]
    assert all(n.memory > 0 and n.memory_free > 0 for n in nodes)
    pool = RayResourcePool([1, 1], use_gpu=False, cpus_per_worker=0.3)
    try:
        reserved = pool.node_ids()
        deadline = time.monotonic() + 10  # nodes report what is free a moment later
        while time.monotonic() < deadline:
            free = {n.node_id: n.cpus_free for n in cluster_nodes()}
            if all(abs(free[node] - 1.7) < 1e-6 for node in reserved):
                break
            time.sleep(0.2)
        assert all(abs(free[node] - 1.7) < 1e-6 for node in reserved), free
        assert "CPU 1.7/2 free" in cluster_nodes()[0].describe()
    finally:
        pool.release()


def test_worker_resources_reach_the_bundles(cluster: Any) -> None:
    from ray.util.placement_group import placement_group_table

    pool = RayResourcePool([2, 1], use_gpu=False, cpus_per_worker=0.25, max_colocate_count=5)
    try:
        groups = {id(s.placement_group): s.placement_group for s in pool.slots()}.values()
        bundles = [list(placement_group_table(g)["bundles"].values()) for g in groups]
        assert bundles == [[{"CPU": 0.25}] * 2, [{"CPU": 0.25}]]
        assert pool.actor_resources() == {"num_cpus": 0.05}
    finally:
        pool.release()
    gpu_pool = RayResourcePool([1], cpus_per_worker=0.5, gpus_per_worker=0.25, max_colocate_count=2)
    assert gpu_pool.bundle() == {"CPU": 0.5, "GPU": 0.25}
    assert gpu_pool.actor_resources() == {"num_cpus": 0.25, "num_gpus": 0.125}
    assert RayResourcePool([1], gpus_per_worker=2).bundle() == {"CPU": 1.0, "GPU": 2.0}
    with pytest.raises(ConfigurationError, match=r"gpus_per_worker must be > 0.*got 0"):
        RayResourcePool([1], gpus_per_worker=0)


def test_layouts_that_cannot_fit_are_refused_before_reserving(cluster: Any) -> None:
    before = _placement_groups()
    with pytest.raises(ConfigurationError) as too_many:
        RayResourcePool([1, 1, 1], use_gpu=False).slots()
    message = str(too_many.value)
    assert "has 3 entries but the cluster has 2 alive nodes" in message
    assert "ray start --address=" in message and "use fewer nodes" in message
    with pytest.raises(ConfigurationError) as too_big:
        RayResourcePool([1], use_gpu=False, cpus_per_worker=8).slots()
    message = str(too_big.value)
    assert "process_on_nodes[0] needs CPU 8 on one node" in message
    assert re.search(r"CPU [\d.]+/2 free", message) and "smaller cpus_per_worker" in message
    with pytest.raises(ConfigurationError, match=r"needs CPU 1, GPU 1 .*GPU 0/0"):
        RayResourcePool([1], use_gpu=True).slots()  # a GPU pool on CPU-only nodes
    assert _placement_groups() == before


def test_joining_by_ray_address_drops_start_only_arguments(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    ray.shutdown()
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    ensure_ray(num_cpus=4, log_to_driver=False)  # num_cpus would be refused by a running cluster
    assert len(cluster_nodes()) == 2
    assert not started_local_ray()  # so groups leave the nodes' loopback setting alone


def test_placement_timeout_names_the_short_node(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hf_controller.ray import resource_pool

    before = _placement_groups()
    holder = RayResourcePool([1, 1], use_gpu=False, cpus_per_worker=1.5)
    holder.slots()  # leaves 0.5 CPU free on each node
    monkeypatch.setattr(resource_pool, "PLACEMENT_TIMEOUT_S", 2.0)
    try:
        with pytest.raises(ConfigurationError) as timeout:
            RayResourcePool([1], use_gpu=False, cpus_per_worker=1.0).slots()
    finally:
        holder.release()
    message = str(timeout.value)
    assert "could not be placed within 2s on node" in message
    assert "short of CPU (needs 1, 0.5 free)" in message and "Free per node: node" in message
    assert "CPU_group" not in message  # only real resources, not Ray's internal ones
    assert _placement_groups() == before  # the pending group was removed, not left waiting
