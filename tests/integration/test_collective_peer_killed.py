"""A collective whose peer was killed ends with a named error, not a hang.

Two workers join a gloo group through hf_engines' ``init_distributed`` (the path every
engine worker takes). Rank 1 waits in ``all_reduce`` while the driver SIGKILLs rank 0;
the driver must get a :class:`WorkerDiedError` for rank 0 within seconds, and the report
must say what became of rank 1 (its collective failed, or its stack).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    WorkerDiedError,
    register,
)
from hf_engines.workers.distributed import collective_timeout, init_distributed


class CollectiveWorker(Worker):
    def __init__(self, timeout_s: float) -> None:
        super().__init__()
        init_distributed(self.rank, self.world_size, self.local_rank, "cpu", timeout_s=timeout_s)

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def reduce_unless(self, idle_rank: int) -> float:
        if self.rank == idle_rank:
            time.sleep(600)  # never joins: the driver kills it here
        value = torch.tensor([1.0])
        dist.all_reduce(value)
        return value.item()


def test_peer_killed_during_all_reduce_is_named(ray_session: Any) -> None:
    group = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False),
        RayClassWithInitArgs(CollectiveWorker, timeout_s=30.0),
        name_prefix="collective",
    )
    try:
        pids = group.pid()
        handles = group.reduce_unless(0)
        time.sleep(1.0)  # rank 1 is now inside all_reduce, waiting for rank 0
        start = time.monotonic()
        os.kill(pids[0], signal.SIGKILL)
        try:
            group.wait_results("reduce_unless", handles)
            raise AssertionError("the call returned although rank 0 was killed")
        except WorkerDiedError as error:
            elapsed = time.monotonic() - start
            assert elapsed < 30.0, f"took {elapsed:.1f}s"  # well inside the 30 s group timeout
            assert (error.group, error.rank, error.method) == ("collective", 0, "reduce_unless")
            assert "SIGKILL" in error.cause or "died" in error.cause, error.cause
            assert "--- the other ranks ---" in error.details
            # gloo ends the survivor's collective when the peer's connection drops; were it
            # still waiting, its stack would show the all_reduce instead.
            assert "collective rank 1 failed too" in error.details or "all_reduce" in (
                error.details
            ), error.details
    finally:
        group.shutdown()


def test_collective_timeout_is_configurable(monkeypatch: Any) -> None:
    assert collective_timeout().total_seconds() == 600.0
    monkeypatch.setenv("HF_DIST_TIMEOUT_S", "45")
    assert collective_timeout().total_seconds() == 45.0
    assert collective_timeout(5).total_seconds() == 5.0
    monkeypatch.setenv("HF_DIST_TIMEOUT_S", "-1")
    try:
        collective_timeout()
        raise AssertionError("a negative timeout was accepted")
    except ValueError as error:
        assert "HF_DIST_TIMEOUT_S" in str(error)
