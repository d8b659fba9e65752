"""The local backend: the same worker classes in the driver process, chosen by one switch.

``make_worker_group`` is that switch: its ``backend`` argument, else ``HF_CONTROLLER_BACKEND``.
"""

import os
from typing import Any

import pytest
from rows import Rows

from hf_controller import (
    ConfigurationError,
    Dispatch,
    LocalWorkerGroup,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePool,
    Worker,
    WorkerGroupError,
    create_colocated_worker_cls,
    make_worker_group,
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
    group: Any = make_worker_group(
        pool, RayClassWithInitArgs(CounterWorker, start=5), backend="local"
    )
    assert isinstance(group, LocalWorkerGroup)
    assert group.where() == [(os.getpid(), r, 3) for r in range(3)]
    assert group.tag(Rows(range(5))).values == [(0, 0), (0, 1), (1, 2), (1, 3), (2, 4)]
    assert [w.count for w in group.workers] == [7, 7, 6]  # plain objects: inspect them directly
    assert group.later() == ["async 0", "async 1", "async 2"]


def test_ray_backend_builds_a_ray_group(ray_session: Any) -> None:
    group: Any = make_worker_group(
        RayResourcePool([1], use_gpu=False), RayClassWithInitArgs(CounterWorker), backend="ray"
    )
    try:
        assert isinstance(group, RayWorkerGroup)
        [(pid, rank, size)] = group.where()
        assert (rank, size) == (0, 1) and pid != os.getpid()
    finally:
        group.kill()


def test_environment_variable_picks_the_backend_when_none_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_CONTROLLER_BACKEND", "local")
    pool = RayResourcePool([2], use_gpu=False)
    group = make_worker_group(pool, RayClassWithInitArgs(CounterWorker))
    assert isinstance(group, LocalWorkerGroup) and group.world_size == 2
    monkeypatch.setenv("HF_CONTROLLER_BACKEND", "mpi")
    with pytest.raises(
        ConfigurationError, match=r"backend 'mpi' \(from HF_CONTROLLER_BACKEND\).*'ray', 'local'"
    ):
        make_worker_group(pool, RayClassWithInitArgs(CounterWorker))
    # An explicit backend wins over the environment.
    group = make_worker_group(pool, RayClassWithInitArgs(CounterWorker), backend="local")
    assert isinstance(group, LocalWorkerGroup)


def test_unknown_backend_names_the_value_and_the_choices() -> None:
    with pytest.raises(
        ConfigurationError,
        match="unknown worker-group backend 'dask'; choose one of 'ray', 'local'",
    ):
        make_worker_group(None, RayClassWithInitArgs(CounterWorker), backend="dask")


def test_ray_backend_needs_a_ray_pool() -> None:
    with pytest.raises(ConfigurationError, match=r"RayResourcePool\(\[2\]\)"):
        make_worker_group(ResourcePool([2]), RayClassWithInitArgs(CounterWorker), backend="ray")


def test_ray_worker_group_has_no_backend_argument() -> None:
    with pytest.raises(ConfigurationError, match=r"make_worker_group\(\.\.\., backend=\.\.\.\)"):
        RayWorkerGroup(
            RayResourcePool([1], use_gpu=False),
            RayClassWithInitArgs(CounterWorker),
            backend="local",
        )


def test_local_group_of_a_colocated_class_spawns_roles() -> None:
    roles = {
        "a": RayClassWithInitArgs(CounterWorker, start=1),
        "b": RayClassWithInitArgs(CounterWorker),
    }
    group: Any = make_worker_group(
        None, create_colocated_worker_cls(roles), backend="local", world_size=2
    )
    views = group.spawn(["a", "b"])
    assert views["a"].tag(Rows([1, 2])).values == [(0, 1), (1, 2)]
    counts = [(w.workers["a"].count, w.workers["b"].count) for w in group.workers]
    assert counts == [(2, 0), (2, 0)]


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
