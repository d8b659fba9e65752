"""A worker computes with the cores its bundle holds (hf_controller.threads)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    register,
)
from hf_controller.ray.resource_pool import bundles_per_node
from hf_controller.threads import (
    THREADS_ENV,
    apply_worker_threads,
    threads_per_worker,
    usable_cores,
)


class ThreadsWorker(Worker):
    @register(Dispatch.ALL_TO_ALL)
    def threads(self) -> dict[str, Any]:
        keys = (THREADS_ENV, "OMP_NUM_THREADS", "LOCAL_WORLD_SIZE")
        return {key: os.environ.get(key) for key in keys}


@pytest.mark.parametrize(
    ("cpus_per_worker", "workers", "node_cpus", "expected"),
    [
        (0.1, 1, 16, 16),  # one fractional worker: the whole node
        (0.1, 4, 16, 4),  # four share it
        (0.1, 8, 4, 1),  # never below one
        (2.0, 8, 16, 2),  # whole cores: what the bundle holds
        (1.5, 1, 16, 1),
    ],
)
def test_threads_per_worker(
    cpus_per_worker: float, workers: int, node_cpus: float, expected: int
) -> None:
    assert threads_per_worker(cpus_per_worker, workers, node_cpus) == expected


def test_apply_caps_at_the_share_of_usable_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREADS_ENV, "1000")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert apply_worker_threads() == usable_cores()
    assert os.environ["OMP_NUM_THREADS"] == str(usable_cores())
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(usable_cores() * 2))
    assert apply_worker_threads() == 1


def test_no_setting_leaves_the_process_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert apply_worker_threads() is None
    assert os.environ["OMP_NUM_THREADS"] == "3"


def test_bundles_are_counted_per_node_over_reserved_groups() -> None:
    table = {
        "a": {"state": "CREATED", "bundles_to_node_id": {0: "n1", 1: "n1", 2: "n2"}},
        "b": {"state": "CREATED", "bundles_to_node_id": {0: "n1"}},
        "c": {"state": "REMOVED", "bundles_to_node_id": {0: "n1"}},
    }
    assert bundles_per_node(table) == {"n1": 3, "n2": 1}


def placed_bundles() -> int:
    """Bundles of every reserved placement group of the session cluster (one node)."""
    from ray.util.placement_group import placement_group_table

    return sum(bundles_per_node(placement_group_table()).values())


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("prestart", [False, True])
def test_group_gives_each_rank_its_share(prestart: bool) -> None:
    """The session cluster declares 4 CPUs: fractional ranks share them with every bundle
    reserved on the node (a second pool, as a separate rollout's, counts too), and take
    at most their share of the cores this machine really has."""
    pool = RayResourcePool([2], use_gpu=False)
    other = RayResourcePool([1], use_gpu=False)
    if prestart:
        pool.prestart(())
    other.slots()  # reserved before the group's workers start, as the trainers do
    group = RayWorkerGroup(pool, RayClassWithInitArgs(ThreadsWorker))
    try:
        told = max(1, 4 // placed_bundles())
        for seen in group.threads():
            assert seen[THREADS_ENV] == str(told)
            assert seen["LOCAL_WORLD_SIZE"] == "2"
            assert seen["OMP_NUM_THREADS"] == str(max(1, min(told, usable_cores() // 2)))
    finally:
        group.shutdown()
        pool.release()
        other.release()
