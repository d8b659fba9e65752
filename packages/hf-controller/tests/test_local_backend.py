"""The local backend: the same worker classes in the driver process, chosen by one switch."""

import os
from typing import Any

import pytest
from rows import Rows

from hf_controller import (
    Dispatch,
    LocalWorkerGroup,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    WorkerGroupError,
    register,
)


class CounterWorker(Worker):
    def __init__(self, start: int = 0) -> None:
        super().__init__()
        self.count = start

    @register(Dispatch.ONE_TO_ALL)
    def where(self) -> tuple[int, int, int]:
        return os.getpid(), self.rank, self.world_size

    @register(Dispatch.DP_COMPUTE_PROTO)
    def tag(self, batch: Rows) -> Rows:
        self.count += len(batch)
        return Rows([(self.rank, v) for v in batch.values])

    @register(Dispatch.ONE_TO_ALL)
    async def later(self) -> str:
        return f"async {self.rank}"

    @register(Dispatch.ONE_TO_ALL)
    def boom(self) -> None:
        raise RuntimeError("broken on purpose")


def test_backend_argument_runs_workers_in_the_driver() -> None:
    pool = RayResourcePool([3], use_gpu=False)  # not reserved: the local backend never touches Ray
    group = RayWorkerGroup(pool, RayClassWithInitArgs(CounterWorker, start=5), backend="local")
    assert isinstance(group, LocalWorkerGroup)
    assert group.where() == [(os.getpid(), r, 3) for r in range(3)]
    assert group.tag(Rows(range(5))).values == [(0, 0), (0, 1), (1, 2), (1, 3), (2, 4)]
    assert [w.count for w in group.workers] == [7, 7, 6]  # plain objects: inspect them directly
    assert group.later() == ["async 0", "async 1", "async 2"]


def test_environment_variable_switches_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_CONTROLLER_BACKEND", "local")
    group = RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(CounterWorker))
    assert isinstance(group, LocalWorkerGroup)
    monkeypatch.setenv("HF_CONTROLLER_BACKEND", "mpi")
    with pytest.raises(ValueError, match="unknown backend 'mpi'"):
        RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(CounterWorker))


def test_errors_carry_rank_and_the_original_exception() -> None:
    group = LocalWorkerGroup(world_size=2, ray_cls_with_init=RayClassWithInitArgs(CounterWorker))
    with pytest.raises(WorkerGroupError, match="rank 0 failed in boom") as info:
        group.boom()
    assert isinstance(info.value.__cause__, RuntimeError)


def test_breakpoint_reaches_the_worker_method(monkeypatch: pytest.MonkeyPatch) -> None:
    stops: list[Any] = []
    monkeypatch.setattr("sys.breakpointhook", lambda *a, **k: stops.append(os.getpid()))

    class Debugged(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def step(self) -> int:
            breakpoint()
            return self.rank

    group = LocalWorkerGroup(world_size=2, ray_cls_with_init=RayClassWithInitArgs(Debugged))
    assert group.step() == [0, 1]
    assert stops == [os.getpid(), os.getpid()]  # the debugger hook ran in this very process
