"""A 4-worker group initialises torch.distributed (gloo) from the env the group sets."""

from typing import Any

import torch
import torch.distributed as dist

from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    register,
)


class AllReduceWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT come from the group

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce(self) -> tuple[int, float]:
        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return dist.get_rank(), value.item()


def test_all_reduce_across_four_workers(ray_session: Any) -> None:
    group = RayWorkerGroup(
        RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(AllReduceWorker)
    )
    assert group.all_reduce() == [(rank, 10.0) for rank in range(4)]
