"""A gloo all_reduce spans the nodes of a two-node Ray cluster (one pool entry per node)."""

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    ensure_ray,
    register,
)
from hf_controller.testing import local_multinode_cluster


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Any]:
    """Two local nodes of 2 CPUs; the session's local Ray comes back afterwards."""
    import ray

    was_running = ray.is_initialized()
    with local_multinode_cluster([2, 2]) as cluster:
        yield cluster
    if was_running:  # later modules of the session expect the conftest's local Ray
        ensure_ray(num_cpus=4, log_to_driver=False)


class NodeAllReduceWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT come from the group

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce(self) -> tuple[int, str, float]:
        import ray

        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return dist.get_rank(), ray.get_runtime_context().get_node_id(), value.item()


def test_all_reduce_spans_two_nodes(two_nodes: Any) -> None:
    pool = RayResourcePool([2, 1], use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(NodeAllReduceWorker))
    try:
        first, second = pool.node_ids()
        assert group.all_reduce() == [(0, first, 6.0), (1, first, 6.0), (2, second, 6.0)]
        assert first != second
    finally:
        group.kill()
        pool.release()
