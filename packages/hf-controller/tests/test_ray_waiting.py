"""A driver waits on non-blocking calls without Ray of its own (``hf_controller.waiting``):
a timeout names what it waited for, a failure or a dead worker surfaces at once."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hf_controller import (
    Dispatch,
    LocalWorkerGroup,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WaitTimeoutError,
    Worker,
    WorkerDiedError,
    WorkerGroupError,
    dead_workers,
    is_worker_death,
    register,
    wait_all,
    wait_any,
    wait_together,
)


class NapWorker(Worker):
    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def nap(self, seconds: list[float]) -> int:
        time.sleep(seconds[self.rank])
        return self.rank

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def fail_on(self, rank: int, others_wait_s: float) -> int:
        if self.rank == rank:
            raise ValueError(f"bad input on rank {self.rank}")
        time.sleep(others_wait_s)
        return self.rank

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def die_on(self, rank: int, others_wait_s: float) -> int:
        if self.rank == rank:
            os._exit(3)
        time.sleep(others_wait_s)
        return self.rank


@pytest.fixture
def nappers(ray_session: Any) -> Iterator[RayWorkerGroup]:
    group = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(NapWorker), name_prefix="nap"
    )
    yield group
    group.shutdown()


def test_wait_all_returns_values_in_order_local_ones_included(nappers: RayWorkerGroup) -> None:
    refs = nappers.nap([0.3, 0.0])
    assert wait_all([refs[0], "local", refs[1], refs[0]], timeout_s=60) == [0, "local", 1, 0]
    assert wait_all([]) == []


def test_wait_all_timeout_names_what_it_waited_for(nappers: RayWorkerGroup) -> None:
    refs = nappers.nap([0.0, 30.0])
    start = time.monotonic()
    with pytest.raises(WaitTimeoutError) as info:
        wait_all(refs, timeout_s=1.0, what="the nappers' nap")
    assert time.monotonic() - start < 5
    error = info.value
    assert (error.what, error.pending, error.total) == ("the nappers' nap", 1, 2)
    assert error.timeout_s == 1.0
    assert "waited 1s for the nappers' nap: 1 of 2 had not finished; raise timeout_s" in str(error)
    assert isinstance(error, TimeoutError) and not is_worker_death(error)


def test_wait_all_raises_a_remote_error_without_waiting_for_the_others(
    nappers: RayWorkerGroup,
) -> None:
    start = time.monotonic()
    with pytest.raises(ValueError, match="bad input on rank 1") as info:
        wait_all(nappers.fail_on(1, others_wait_s=60))
    assert time.monotonic() - start < 10
    assert not is_worker_death(info.value)


def test_wait_all_surfaces_a_dead_workers_error(nappers: RayWorkerGroup) -> None:
    start = time.monotonic()
    with pytest.raises(Exception) as info:  # Ray's actor error: is_worker_death asks below
        wait_all(nappers.die_on(0, others_wait_s=60), what="die_on")
    assert time.monotonic() - start < 10, "the dead worker's error waited for the live rank"
    assert is_worker_death(info.value), repr(info.value)
    assert dead_workers([nappers, object()], timeout_s=10) == ["nap rank 0"]


def test_is_worker_death_tells_a_death_from_other_errors() -> None:
    assert is_worker_death(WorkerDiedError("g", 0, "m", "node", "the worker process died"))
    assert not is_worker_death(WorkerGroupError("g", 0, "m", "node", "ValueError: x"))
    assert not is_worker_death(RuntimeError("a bug in the driver"))


def test_wait_any_returns_the_finished_handles(nappers: RayWorkerGroup) -> None:
    slow, fast = nappers.nap([30.0, 0.0])
    assert wait_any([slow, fast]) == [fast]  # waits for the first, not for both
    assert wait_any([slow], timeout_s=0) == []  # only looks
    assert wait_any([slow, "local"], timeout_s=0) == ["local"]  # a local result is finished
    assert wait_any([fast, slow], timeout_s=0) == [fast]


def test_wait_together_raises_a_failure_named_by_its_group(ray_session: Any) -> None:
    other = RayWorkerGroup(
        RayResourcePool([1], use_gpu=False), RayClassWithInitArgs(NapWorker), name_prefix="other"
    )
    failing = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(NapWorker), name_prefix="failing"
    )
    try:
        wait_together(("nap", other, other.nap([0.1])), ("nap", failing, failing.nap([0.0, 0.2])))
        start = time.monotonic()
        with pytest.raises(WorkerGroupError) as info:
            wait_together(
                ("nap", other, other.nap([60.0])),  # still napping when the failure is raised
                ("fail_on", failing, failing.fail_on(1, others_wait_s=0.0)),
            )
        assert time.monotonic() - start < 10
        assert (info.value.group, info.value.rank, info.value.method) == ("failing", 1, "fail_on")
        assert "ValueError: bad input on rank 1" in str(info.value)
    finally:
        other.shutdown()
        failing.shutdown()


def test_local_handles_are_results_already() -> None:
    group = LocalWorkerGroup(ray_cls_with_init=RayClassWithInitArgs(NapWorker), world_size=2)
    handles = group.nap([0.0, 0.0])
    assert handles == [0, 1]
    assert wait_all(handles) == [0, 1]
    assert wait_any(handles) == [0, 1]
    wait_together(("nap", group, handles))  # nothing to wait for
    assert dead_workers([group]) == []
