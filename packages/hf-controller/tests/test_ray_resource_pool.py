"""Placement-group pools: fitting CPU pools, split and merge, restarts, several groups per pool."""

import subprocess
import sys
import textwrap
from typing import Any

import pytest
from rows import Rows

from hf_controller import (
    ConfigurationError,
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    merge_resource_pool,
    register,
    split_resource_pool,
)


class WhereWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def where(self) -> tuple[int, int, str]:
        import os

        return self.rank, self.world_size, os.environ["LOCAL_RANK"]

    @register(Dispatch.DP_COMPUTE_PROTO)
    def tag(self, batch: Rows) -> Rows:
        return Rows([(self.group_name, v) for v in batch.values])


def test_split_and_merge_pools(ray_session: Any) -> None:
    pool = RayResourcePool([4], use_gpu=False, name_prefix="splittable")
    first, second = split_resource_pool(pool, 2)
    assert first.world_size == second.world_size == 2
    group = RayWorkerGroup(second, RayClassWithInitArgs(WhereWorker))
    assert group.where() == [(0, 2, "0"), (1, 2, "1")]
    merged = merge_resource_pool(first, second)
    assert RayWorkerGroup(merged, RayClassWithInitArgs(WhereWorker)).world_size == 4
    parts = split_resource_pool(RayResourcePool([3], use_gpu=False), [1, 2])
    assert [p.world_size for p in parts] == [1, 2]
    with pytest.raises(ConfigurationError, match="cannot split a pool of 4 processes"):
        split_resource_pool(pool, 3)


def test_two_groups_colocated_on_one_pool(ray_session: Any) -> None:
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=2)
    actor = RayWorkerGroup(pool, RayClassWithInitArgs(WhereWorker), name_prefix="actor")
    critic = RayWorkerGroup(pool, RayClassWithInitArgs(WhereWorker), name_prefix="critic")
    assert actor.tag(Rows([1, 2])).values == [("actor", 1), ("actor", 2)]
    assert critic.tag(Rows([1, 2])).values == [("critic", 1), ("critic", 2)]


def test_bad_pool_arguments_are_explained() -> None:
    with pytest.raises(ValueError, match=r"process_on_nodes must be .*got \[0\]"):
        RayResourcePool([0], use_gpu=False)
    with pytest.raises(ConfigurationError, match="cpus_per_worker must be > 0"):
        RayResourcePool([1], use_gpu=False, cpus_per_worker=0)


def test_restarted_driver_reuses_its_placement_group(ray_session: Any, tmp_path: Any) -> None:
    """Two drivers in turn, same name_prefix, detached pool: no 'already exists' failure."""
    address = ray_session.get_runtime_context().gcs_address
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import ray
            ray.init(address={address!r}, namespace="restart_test", log_to_driver=False)
            from hf_controller import RayResourcePool
            pool = RayResourcePool([2], use_gpu=False, name_prefix="restartable", detached=True)
            print(len(pool.slots()), pool.slots()[0].placement_group.id.hex())
            import sys
            if sys.argv[-1] == "release":
                pool.release()
            """
        )
    )
    runs = [
        subprocess.run(
            [sys.executable, str(script), last], capture_output=True, text=True, timeout=120
        )
        for last in ("keep", "release")
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    first, second = (run.stdout.split()[-2:] for run in runs)
    assert first == second  # the second driver reattached to the same reservation


def test_same_name_with_another_shape_is_refused_not_destroyed(ray_session: Any) -> None:
    kept = RayResourcePool([2], use_gpu=False, name_prefix="shaped")
    group = RayWorkerGroup(kept, RayClassWithInitArgs(WhereWorker))
    with pytest.raises(ConfigurationError, match="'shaped_pg_0' already exists with bundles"):
        RayResourcePool([3], use_gpu=False, name_prefix="shaped").slots()
    assert group.where()[1][:2] == (1, 2)  # the first group's reservation is untouched
