"""Failures are explained, not hung: exceptions and dead workers name group, rank and method."""

import os
import signal
import time
from typing import Any

import pytest

from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    WorkerDiedError,
    WorkerGroupError,
    register,
)


class StubbornError(RuntimeError):
    """Pickles, but cannot be unpickled: its ``__init__`` needs more than ``args`` holds."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class FragileWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"bad input on rank {self.rank}")
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def fail_stubbornly_on(self, rank: int) -> int:
        if self.rank == rank:
            raise StubbornError(f"push rejected on rank {self.rank}", 7)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def die_on(self, rank: int, others_wait_s: float, how: str = "exit") -> int:
        if self.rank == rank:
            print("about to exit", flush=True)
            if how == "sigkill":  # what the kernel's OOM killer does
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        time.sleep(others_wait_s)  # the other ranks look like they wait in a collective
        return self.rank


@pytest.fixture
def fragile(ray_session: Any) -> RayWorkerGroup:
    return RayWorkerGroup(
        RayResourcePool([2], use_gpu=False),
        RayClassWithInitArgs(FragileWorker),
        name_prefix="fragile",
    )


def test_remote_exception_names_rank_method_and_keeps_traceback(fragile: RayWorkerGroup) -> None:
    with pytest.raises(WorkerGroupError) as info:
        fragile.fail_on(1)
    error = info.value
    assert (error.group, error.rank, error.method) == ("fragile", 1, "fail_on")
    assert error.node == "127.0.0.1"
    assert "ValueError: bad input on rank 1" in str(error)
    assert "raise ValueError" in error.details  # the worker's own traceback
    assert isinstance(error.__cause__, ValueError)
    assert fragile.fail_on(5) == [0, 1]  # the group still works afterwards


def test_an_exception_that_cannot_be_unpickled_still_names_rank_and_message(
    fragile: RayWorkerGroup,
) -> None:
    """Ray raises its bare ``UnserializableException`` for it; the group names the rank, the
    original ``Type: message`` and what the class needs."""
    with pytest.raises(WorkerGroupError) as info:
        fragile.fail_stubbornly_on(0)
    error = info.value
    assert (error.group, error.rank, error.method) == ("fragile", 0, "fail_stubbornly_on")
    assert "StubbornError: push rejected on rank 0" in error.cause
    assert "__reduce__" in error.cause
    assert "raise StubbornError" in error.details  # the worker's traceback, as text
    assert fragile.fail_stubbornly_on(5) == [0, 1]


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_dead_worker_is_reported_within_seconds_not_hung(fragile: RayWorkerGroup, how: str) -> None:
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        fragile.die_on(0, others_wait_s=120, how=how)  # rank 1 would keep the call open 2 min
    elapsed = time.monotonic() - start
    assert elapsed < 10, f"took {elapsed:.1f}s"
    error = info.value
    assert (error.group, error.rank, error.method) == ("fragile", 0, "die_on")
    assert "died" in error.cause
    assert "about to exit" in error.details  # last lines of the dead worker's log


class BrokenAtStart(Worker):
    def __init__(self) -> None:
        super().__init__()
        raise RuntimeError("cannot start: no model here")

    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


def test_non_blocking_start_reports_a_failed_init_at_the_first_call(ray_session: Any) -> None:
    group = RayWorkerGroup(
        RayResourcePool([1], use_gpu=False),
        RayClassWithInitArgs(BrokenAtStart),
        name_prefix="broken",
        block_until_ready=False,  # returns while the worker starts
    )
    try:
        with pytest.raises(WorkerGroupError) as info:
            group.ping()
        assert (info.value.group, info.value.rank, info.value.method) == ("broken", 0, "__init__")
        assert "cannot start: no model here" in str(info.value)
    finally:
        group.shutdown()
