"""Controller faults: dead and stuck workers, a collective's dead peer, leaked reservations.

Each case starts its own local Ray (2 CPUs, like the CI machine), injects one fault into
real worker processes and checks what the user is told. See :mod:`faults`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from faults import FaultCase, FaultResult, first_line, stopwatch

from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    WorkerDiedError,
    WorkerTimeoutError,
    register,
)


def sleep_forever() -> None:
    """A stuck worker: alive, never answering (the stack must name this function)."""
    time.sleep(10**6)


class FaultWorker(Worker):
    """Methods that misbehave on one rank."""

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL, timeout_s=3.0)
    def stuck_on(self, rank: int) -> int:
        if self.rank == rank:
            sleep_forever()
        return self.rank

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def wait_long(self) -> int:
        time.sleep(120)
        return self.rank


class CollectiveWorker(Worker):
    """Two ranks in a gloo group; rank 0 never joins the all_reduce."""

    def __init__(self) -> None:
        super().__init__()
        from hf_engines.workers.distributed import init_distributed

        init_distributed(self.rank, self.world_size, self.local_rank, "cpu", timeout_s=60)

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def reduce_unless_rank0(self) -> float:
        import torch
        import torch.distributed as dist

        if self.rank == 0:
            time.sleep(600)
        value = torch.tensor([1.0])
        dist.all_reduce(value)
        return float(value.item())


@contextmanager
def local_ray() -> Iterator[Any]:
    """A fresh local Ray for one case, shut down afterwards."""
    import ray

    from hf_controller import ensure_ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ensure_ray(num_cpus=2, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def group_of(cls: type, name: str, **kwargs: Any) -> Any:
    """A 2-worker group of ``cls`` (typed ``Any``: its worker methods are bound at runtime)."""
    pool = RayResourcePool([2], use_gpu=False)
    return RayWorkerGroup(pool, RayClassWithInitArgs(cls), name_prefix=name, **kwargs)


def alive_placement_groups() -> list[str]:
    from ray.util import placement_group_table

    return [e["name"] for e in placement_group_table().values() if e["state"] != "REMOVED"]


def worker_sigkill_during_call(scratch: Path) -> FaultResult:
    with local_ray():
        group = group_of(FaultWorker, "victim")
        try:
            pids = group.pid()
            handles = group.wait_long()
            with stopwatch() as elapsed:
                os.kill(pids[1], signal.SIGKILL)
                try:
                    group.wait_results("wait_long", handles)
                    raise AssertionError("the call returned although rank 1 was killed")
                except WorkerDiedError as error:
                    seconds = elapsed()
                    assert (error.group, error.rank, error.method) == ("victim", 1, "wait_long")
                    assert "died" in error.cause, error.cause
                    message = str(error)
        finally:
            group.shutdown()
    return FaultResult("named error", seconds, "nothing", first_line(message))


def worker_stuck(scratch: Path) -> FaultResult:
    with local_ray():
        group = group_of(FaultWorker, "stuck")
        try:
            with stopwatch() as elapsed:
                try:
                    group.stuck_on(0)
                    raise AssertionError("a call stuck forever returned")
                except WorkerTimeoutError as error:
                    seconds = elapsed()
                    assert error.ranks == [0] and error.method == "stuck_on", str(error)
                    assert "sleep_forever" in error.stacks[0], error.stacks[0]
                    message = str(error)
        finally:
            group.shutdown()
    return FaultResult(
        "named error", seconds, "nothing", first_line(message) + " (stack: in sleep_forever)"
    )


def collective_peer_killed(scratch: Path) -> FaultResult:
    with local_ray():
        group = group_of(CollectiveWorker, "collective")
        try:
            pids = group.pid()
            handles = group.reduce_unless_rank0()
            time.sleep(1.0)  # rank 1 now waits in all_reduce
            with stopwatch() as elapsed:
                os.kill(pids[0], signal.SIGKILL)
                try:
                    group.wait_results("reduce_unless_rank0", handles)
                    raise AssertionError("the collective returned although its peer was killed")
                except WorkerDiedError as error:
                    seconds = elapsed()
                    assert error.rank == 0, str(error)
                    assert "--- the other ranks ---" in error.details, error.details
                    assert "rank 1" in error.details.split("--- the other ranks ---")[1]
                    message = str(error)
        finally:
            group.shutdown()
    return FaultResult("named error", seconds, "nothing", first_line(message))


def create_drop_cycles(scratch: Path, cycles: int = 50) -> FaultResult:
    with local_ray():
        with stopwatch() as elapsed:
            for _ in range(cycles):
                group = group_of(FaultWorker, "cycle")
                assert len(group.pid()) == 2
                del group  # no shutdown(): dropping the last reference frees it all
            seconds = elapsed()
        left = alive_placement_groups()
        assert not left, f"placement groups left after {cycles} cycles: {left}"
    detail = f"{cycles} groups of 2 workers created and dropped on 2 CPUs; none left"
    return FaultResult("recovered", seconds, "nothing", detail)


DRIVER = textwrap.dedent(
    """
    import time, ray
    from hf_controller import RayResourcePool
    ray.init(address={address!r}, namespace="hybridflow", log_to_driver=False)
    pool = RayResourcePool([2], use_gpu=False, name_prefix="crashed_driver")
    pool.slots()  # held until the driver is killed
    print("ready", flush=True)
    time.sleep(600)
    """
)


def driver_sigkill_leaves_nothing(scratch: Path) -> FaultResult:
    with local_ray() as ray:
        script = DRIVER.format(address=ray.get_runtime_context().gcs_address)
        driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            assert driver.stdout is not None and driver.stdout.readline().strip() == "ready"
            placed = alive_placement_groups()
            assert any(n.startswith("crashed_driver") for n in placed), placed
            with stopwatch() as elapsed:
                driver.send_signal(signal.SIGKILL)
                driver.wait(timeout=30)
                freed = _wait_for(lambda: not alive_placement_groups(), 30.0)
                seconds = elapsed()
            assert freed, f"left behind: {alive_placement_groups()}"
        finally:
            if driver.poll() is None:
                driver.kill()
    detail = "the killed driver's placement groups were removed by Ray with its job"
    return FaultResult("recovered", seconds, "nothing", detail)


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


FAULTS = [
    FaultCase("worker SIGKILL during a call", worker_sigkill_during_call),
    FaultCase("worker stuck (sleeps forever, 3 s deadline)", worker_stuck),
    FaultCase("collective peer killed (gloo all_reduce)", collective_peer_killed),
    FaultCase("50 create/drop cycles of 2-worker groups", create_drop_cycles),
    FaultCase("driver SIGKILL leaves no placement groups", driver_sigkill_leaves_nothing),
]
