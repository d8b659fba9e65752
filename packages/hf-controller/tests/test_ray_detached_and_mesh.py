"""Detached workers reattached from another driver; mesh-aware dispatch."""

import subprocess
import sys
import textwrap
from pathlib import Path
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
    make_nd_compute_dataproto_dispatch_fn,
    register,
)

TP_SIZE = 2


class StatefulWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    @register(Dispatch.ONE_TO_ALL)
    def bump(self) -> int:
        self.seen += 1
        return self.seen


class MeshWorker(Worker):
    """4 ranks as dp=2 x tp=2: tp ranks of one dp rank get the same shard."""

    def __init__(self) -> None:
        super().__init__()
        dp_rank, tp_rank = divmod(self.rank, TP_SIZE)
        self._register_dispatch_collect_info("train", dp_rank=dp_rank, is_collect=tp_rank == 0)

    @register(make_nd_compute_dataproto_dispatch_fn("train"))
    def forward(self, batch: Rows) -> Rows:
        return Rows([(self.rank, v) for v in batch.values])


def test_detached_group_is_reattached_by_another_driver(ray_session: Any, tmp_path: Path) -> None:
    RayWorkerGroup(
        RayResourcePool([2], use_gpu=False, name_prefix="detached_pool"),
        RayClassWithInitArgs(StatefulWorker),
        name_prefix="kept",
        detached=True,
    ).bump()
    address = ray_session.get_runtime_context().gcs_address
    script = tmp_path / "second_driver.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            import ray
            ray.init(address={address!r}, namespace="hybridflow", log_to_driver=False)
            from hf_controller import RayClassWithInitArgs, RayWorkerGroup
            from test_ray_detached_and_mesh import StatefulWorker
            group = RayWorkerGroup.from_detached(
                name_prefix="kept",
                world_size=2,
                ray_cls_with_init=RayClassWithInitArgs(StatefulWorker),
            )
            print(group.bump())
            group.kill()
            """
        )
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "[2, 2]"  # state kept from the first driver


def test_mesh_dispatch_sends_one_shard_per_dp_rank(ray_session: Any) -> None:
    group = RayWorkerGroup(RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(MeshWorker))
    out = group.forward(Rows(range(5)))
    assert out.values == [(0, 0), (0, 1), (0, 2), (2, 3), (2, 4)]  # dp0 via rank 0, dp1 via rank 2
    assert group.dp_layout("train") == ([0, 0, 1, 1], [True, False, True, False])


def test_from_detached_refuses_an_empty_worker_names_list(ray_session: Any) -> None:
    # a plain group's worker_names is [], so passing it on used to build a group of no workers
    with pytest.raises(ConfigurationError, match=r"worker_names=\[\].*named=True"):
        RayWorkerGroup.from_detached(
            worker_names=[], ray_cls_with_init=RayClassWithInitArgs(StatefulWorker)
        )
    with pytest.raises(ConfigurationError, match="world_size=0"):
        RayWorkerGroup.from_detached(
            name_prefix="none", world_size=0, ray_cls_with_init=RayClassWithInitArgs(StatefulWorker)
        )


def test_named_group_is_attached_to_in_the_same_job(ray_session: Any) -> None:
    group = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False),
        RayClassWithInitArgs(StatefulWorker),
        name_prefix="named_group",
        named=True,
    )
    assert group.worker_names == ["named_group:0", "named_group:1"]
    group.bump()
    attached = RayWorkerGroup.from_detached(
        worker_names=group.worker_names, ray_cls_with_init=RayClassWithInitArgs(StatefulWorker)
    )
    assert attached.bump() == [2, 2]  # the same processes: their state is kept
    del attached  # attached groups do not end the workers
    assert group.bump() == [3, 3]
    group.shutdown()
