"""Several roles in one process: colocated and fused workers, spawn and fuse."""

import os
from typing import Any

import pytest
from rows import Rows

from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    register,
)


class Actor(Worker):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.weights = [float(self.rank)]

    @register(Dispatch.ONE_TO_ALL)
    def describe(self) -> tuple[str, int, float]:
        return "actor", os.getpid(), self.lr

    @register(Dispatch.DP_COMPUTE_PROTO)
    def update(self, batch: Rows) -> Rows:
        self.weights.append(float(len(batch)))
        return Rows([v * self.lr for v in batch.values])


class Rollout(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def describe(self) -> tuple[str, int, float]:
        return "rollout", os.getpid(), 0.0

    @register(Dispatch.ONE_TO_ALL)
    def pull_weights(self) -> list[float]:
        # Fused roles see their siblings in memory: no copy through Ray.
        return self.fused_workers["actor"].weights

    @register(Dispatch.ONE_TO_ALL)
    async def ping(self) -> str:
        return f"pong {self.rank}"


def roles() -> dict[str, RayClassWithInitArgs]:
    return {"actor": RayClassWithInitArgs(Actor, lr=0.5), "rollout": RayClassWithInitArgs(Rollout)}


def test_colocated_roles_share_one_process_per_rank(ray_session: Any) -> None:
    colocated = create_colocated_worker_cls(roles())
    colocated.update_options({"max_concurrency": 2})  # Ray actor options apply to it too
    group = RayWorkerGroup(RayResourcePool([2], use_gpu=False), colocated)
    views = group.spawn({"actor", "rollout"})
    actor_info, rollout_info = views["actor"].describe(), views["rollout"].describe()
    assert [i[0] for i in actor_info] == ["actor", "actor"] and actor_info[0][2] == 0.5
    assert [i[1] for i in actor_info] == [i[1] for i in rollout_info]  # same pids
    assert len({i[1] for i in actor_info}) == 2  # one process per rank
    assert views["actor"].update(Rows([2, 4, 6])).values == [1.0, 2.0, 3.0]
    assert views["rollout"].ping() == ["pong 0", "pong 1"]
    assert group.actor_describe()[0][0] == "actor"  # prefixed methods on the parent group
    with pytest.raises(ValueError, match="no colocated role 'critic'"):
        group.spawn({"critic"})


def test_fused_roles_hand_data_over_in_memory(ray_session: Any) -> None:
    group = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False), create_colocated_worker_cls_fused(roles())
    )
    group.fuse({"actor", "rollout"})
    group.actor.update(Rows([1, 2, 3, 4]))  # type: ignore[attr-defined]
    assert group.rollout.pull_weights() == [[0.0, 2.0], [1.0, 2.0]]  # type: ignore[attr-defined]


def test_spawn_needs_a_colocated_class(ray_session: Any) -> None:
    group = RayWorkerGroup(RayResourcePool([1], use_gpu=False), RayClassWithInitArgs(Rollout))
    with pytest.raises(ValueError, match="create_colocated_worker_cls"):
        group.spawn({"rollout"})
