"""No hang without a name: a call past its deadline names the stuck ranks and their stacks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    WorkerGroupError,
    WorkerTimeoutError,
    register,
)
from hf_controller.worker_group import CALL_TIMEOUT_ENV


def sleep_forever_in_rank(rank: int, me: int) -> int:
    if me == rank:
        time.sleep(10**6)  # a stuck worker: alive, never answering
    return me


def spin_forever() -> None:
    count = 0
    while True:  # a busy Python loop, holding the GIL between switches
        count += 1


class StuckWorker(Worker):
    @register(Dispatch.ONE_TO_ALL, timeout_s=2.0)
    def sleepy(self, rank: int) -> int:
        return sleep_forever_in_rank(rank, self.rank)

    @register(Dispatch.ONE_TO_ALL)
    def busy(self) -> None:
        spin_forever()

    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


@pytest.fixture
def stuck(ray_session: Any) -> Iterator[RayWorkerGroup]:
    group = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False),
        RayClassWithInitArgs(StuckWorker),
        name_prefix="stuck",
        call_timeout_s=2.0,
    )
    yield group
    group.shutdown()  # the stuck workers would keep their call (and a CPU) forever


def test_sleeping_rank_is_named_with_its_stack(stuck: RayWorkerGroup) -> None:
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError) as info:
        stuck.sleepy(1)  # @register(timeout_s=2.0)
    elapsed = time.monotonic() - start
    assert elapsed < 2.0 + 20, f"took {elapsed:.1f}s"  # deadline + a bounded stack dump
    error = info.value
    assert isinstance(error, WorkerGroupError)
    assert (error.group, error.method, error.ranks, error.timeout_s) == ("stuck", "sleepy", [1], 2)
    assert "within the 2s deadline from rank(s) [1]" in str(error)
    assert "sleep_forever_in_rank" in error.stacks[1]  # the worker's own current frame
    assert "sleep_forever_in_rank" in str(error)
    assert "gc_collect_manager" not in error.stacks[1]  # Ray's idle threads are left out


def test_busy_loop_uses_the_group_default_and_names_every_stuck_rank(
    stuck: RayWorkerGroup,
) -> None:
    with pytest.raises(WorkerTimeoutError) as info:
        stuck.busy()  # no per-method deadline: the group's call_timeout_s=2.0
    error = info.value
    assert error.ranks == [0, 1]
    for rank in (0, 1):
        assert "spin_forever" in error.stacks[rank], error.stacks[rank]
        assert f"stuck rank {rank} (node 127.0.0.1): current stack" in str(error)


def test_execute_all_sync_has_the_deadline_too(stuck: RayWorkerGroup) -> None:
    with pytest.raises(WorkerTimeoutError) as info:
        stuck.execute_all_sync("sleepy", 0)  # the method's own timeout_s=2.0
    assert info.value.ranks == [0]
    assert "sleep_forever_in_rank" in info.value.stacks[0]


def test_deadline_values_are_checked(monkeypatch: pytest.MonkeyPatch, ray_session: Any) -> None:
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        register(timeout_s=0)
    monkeypatch.setenv(CALL_TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=f"{CALL_TIMEOUT_ENV} must be a positive number"):
        RayWorkerGroup(RayResourcePool([1], use_gpu=False), RayClassWithInitArgs(StuckWorker))


def test_environment_default_applies_and_a_fast_call_is_unaffected(
    monkeypatch: pytest.MonkeyPatch, ray_session: Any
) -> None:
    monkeypatch.setenv(CALL_TIMEOUT_ENV, "30")
    group = RayWorkerGroup(RayResourcePool([1], use_gpu=False), RayClassWithInitArgs(StuckWorker))
    try:
        assert group.call_timeout_s == 30.0
        assert group.timeout_for("sleepy") == 2.0 and group.timeout_for("ping") == 30.0
        assert group.ping() == [0]
    finally:
        group.shutdown()
