"""Resources are released: a group's actors and its pool's placement groups are freed on
shutdown, on release and when the group is dropped; a driver that ends leaves none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    register,
    split_resource_pool,
)


class PingWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


def pool_state(pool_name: str) -> set[str]:
    """States of the placement groups whose name starts with ``pool_name``."""
    from ray.util import placement_group_table

    return {
        entry["state"]
        for entry in placement_group_table().values()
        if entry["name"].startswith(pool_name + "_pg_")
    }


def all_dead(group: RayWorkerGroup) -> bool:
    """True when no actor of ``group`` answers any more (each call fails as dead)."""
    import ray

    for worker in group.workers:
        try:
            ray.get(worker.ping.remote(), timeout=10)
            return False
        except ray.exceptions.RayActorError:
            continue
    return True


def wait_until(condition: Any, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return bool(condition())


def make_group(pool: RayResourcePool) -> RayWorkerGroup:
    return RayWorkerGroup(pool, RayClassWithInitArgs(PingWorker))


def test_shutdown_frees_actors_and_placement_groups_and_is_idempotent(ray_session: Any) -> None:
    pool = RayResourcePool([2], use_gpu=False, name_prefix="lt_shutdown")
    group = make_group(pool)
    assert group.ping() == [0, 1] and pool_state("lt_shutdown") == {"CREATED"}
    group.shutdown()
    assert pool_state("lt_shutdown") == {"REMOVED"}
    assert all_dead(group)
    group.shutdown()
    group.kill()  # the older name: the same, still idempotent
    pool.release()
    again = make_group(pool)  # a released pool reserves again on its next use
    assert again.ping() == [0, 1]
    again.kill()
    assert pool_state("lt_shutdown") == {"REMOVED"}


def test_dropping_the_last_reference_frees_at_once(ray_session: Any) -> None:
    group = make_group(RayResourcePool([2], use_gpu=False, name_prefix="lt_drop"))
    ping = group.ping  # a bound group method keeps its group alive, as any method does
    del group  # no gc.collect(): the group is no reference cycle
    assert ping() == [0, 1] and pool_state("lt_drop") == {"CREATED"}
    del ping
    assert pool_state("lt_drop") == {"REMOVED"}
    assert make_group(RayResourcePool([1], use_gpu=False)).ping() == [0]  # a temporary works


class GatedWorker(Worker):
    """A non-blocking method that returns only once a file appears: its call is in flight
    for as long as the test wants, with no timing involved."""

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def after(self, gate: str) -> int:
        while not os.path.exists(gate):
            time.sleep(0.05)
        return self.rank


def test_a_future_outlives_its_dropped_group(ray_session: Any, tmp_path: Path) -> None:
    """``make_group(...).method()``: nothing references the group once the call is issued,
    yet its workers finish the call before they end (then they do end)."""
    import gc

    import ray

    gate = tmp_path / "gate"
    pool = RayResourcePool([2], use_gpu=False, name_prefix="lt_future")
    futures = RayWorkerGroup(pool, RayClassWithInitArgs(GatedWorker)).after(str(gate))
    gc.collect()  # the group is gone; its call cannot have finished (the gate is closed)
    assert pool_state("lt_future") == {"CREATED"}  # the workers still hold the pool
    gate.touch()
    assert ray.get(futures, timeout=60) == [0, 1]
    assert wait_until(lambda: pool_state("lt_future") == {"REMOVED"}, timeout_s=60)


class EngineWorker(Worker):
    """Registers its own ``shutdown``, as hf-rollout's RolloutWorker does."""

    @register(Dispatch.ONE_TO_ALL)
    def shutdown(self) -> None:
        print("engine released", flush=True)
        with open(os.environ["HF_TEST_MARKER"] + f".{self.rank}", "w") as marker:
            marker.write("released")


def test_a_workers_own_shutdown_runs_before_the_group_ends(ray_session: Any, tmp_path: Any) -> None:
    marker = str(tmp_path / "engine")
    group = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False, name_prefix="lt_engine"),
        RayClassWithInitArgs(EngineWorker),
        worker_env={"HF_TEST_MARKER": marker},
    )
    group.shutdown()
    assert [Path(f"{marker}.{r}").read_text() for r in (0, 1)] == ["released", "released"]
    assert pool_state("lt_engine") == {"REMOVED"}
    group.shutdown()  # idempotent: the worker method is not called on dead workers


def test_colocated_groups_share_the_pool_until_the_last_one_ends(ray_session: Any) -> None:
    pool = RayResourcePool([2], use_gpu=False, name_prefix="lt_shared", max_colocate_count=2)
    first, second = make_group(pool), make_group(pool)
    first.shutdown()
    assert pool_state("lt_shared") == {"CREATED"}  # second still uses it
    assert second.ping() == [0, 1]
    del second
    assert pool_state("lt_shared") == {"REMOVED"}


def test_split_parts_never_free_the_pool_they_came_from(ray_session: Any) -> None:
    parent = RayResourcePool([2], use_gpu=False, name_prefix="lt_split")
    left, right = split_resource_pool(parent, 1)
    a, b = make_group(left), make_group(right)
    a.shutdown()
    left.release()  # a part owns nothing: a no-op
    assert pool_state("lt_split") == {"CREATED"} and b.ping() == [0]
    del a, b, left, right
    assert pool_state("lt_split") == {"CREATED"}  # the caller still holds the parent
    del parent  # the parent's finalizer gives the placement group back
    assert pool_state("lt_split") == {"REMOVED"}


def test_create_and_drop_cycles_never_run_out(ray_session: Any) -> None:
    # Each group takes 2 of the session's 4 CPUs: without release the third cycle could
    # not be placed. (tools/reliability runs 50 cycles of the cheap 0.1-CPU layout.)
    start = time.monotonic()
    for _ in range(6):
        group = make_group(RayResourcePool([2], use_gpu=False, cpus_per_worker=1.0))
        assert group.ping() == [0, 1]
        del group
    print(f"6 create/drop cycles: {time.monotonic() - start:.1f}s")


DRIVER = textwrap.dedent(
    """
    import sys, time
    import ray
    from hf_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    sys.path.insert(0, {tests!r})
    from test_ray_lifetime import PingWorker

    ray.init(address={address!r}, namespace="hybridflow", log_to_driver=False)
    kept = RayResourcePool([1], use_gpu=False, name_prefix={name!r} + "_kept", detached=True)
    kept.slots()
    group = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False, name_prefix={name!r}),
        RayClassWithInitArgs(PingWorker),
    )
    assert group.ping() == [0, 1]
    print("ready", flush=True)
    if {how!r} == "exit":
        sys.exit(0)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_an_ended_driver_leaves_only_detached_placement_groups(ray_session: Any, how: str) -> None:
    import ray
    from ray.util.placement_group import get_placement_group, remove_placement_group

    name = f"lt_driver_{how}"
    script = DRIVER.format(
        tests=os.path.dirname(__file__),
        address=ray.get_runtime_context().gcs_address,
        name=name,
        how=how,
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "ready"
        assert pool_state(name) == {"CREATED"}
        if how == "sigkill":
            os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
        assert wait_until(lambda: pool_state(name) == {"REMOVED"}, 30), pool_state(name)
        assert pool_state(name + "_kept") == {"CREATED"}  # detached: meant to outlive it
    finally:
        if driver.poll() is None:
            driver.kill()
        remove_placement_group(get_placement_group(name + "_kept_pg_0"))
