"""Two-phase start: worker processes prestarted on a pool, their class built in them later."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import pytest
import ray as ray_module
from rows import Rows

from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    WorkerGroupError,
    register,
)

PRELOADED = "xml.dom.minidom"
"""A standard-library module no worker imports by itself."""


class HostedWorker(Worker):
    def __init__(self, scale: int = 1) -> None:
        super().__init__()
        self.scale = scale

    @register(Dispatch.DP_COMPUTE_PROTO)
    def double(self, batch: Rows) -> Rows:
        return Rows([(v * 2 * self.scale, self.rank) for v in batch.values])

    @register(Dispatch.ALL_TO_ALL)
    def process(self) -> dict[str, Any]:
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        return {
            "pid": os.getpid(),
            "preloaded": PRELOADED in sys.modules,
            "env": {key: os.environ.get(key) for key in keys},
        }

    @register(Dispatch.ONE_TO_ALL)
    def echo(self, method: str) -> str:  # a keyword the host's own call also has
        return method

    @register(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"bad input on rank {rank}")
        return self.rank


class AsyncWorker(Worker):
    @register(Dispatch.ALL_TO_ALL)
    async def pid(self) -> int:
        return os.getpid()


def test_group_builds_its_workers_in_the_prestarted_processes(ray_session: Any) -> None:
    pool = RayResourcePool([2], use_gpu=False, name_prefix="hosted")
    pool.prestart([PRELOADED])
    hosts = list(pool._hosts)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(HostedWorker, scale=3), name_prefix="hg")
    assert pool.take_hosts() == []  # handed over once
    assert group.workers == hosts
    info = group.process()
    assert [i["preloaded"] for i in info] == [True, True]
    assert [i["env"]["RANK"] for i in info] == ["0", "1"]
    assert {i["env"]["WORLD_SIZE"] for i in info} == {"2"}
    assert info[0]["env"]["MASTER_PORT"] == info[1]["env"]["MASTER_PORT"] is not None
    assert group.echo(method="sgd") == ["sgd", "sgd"]
    out = group.double(Rows(range(5)))
    assert out.values == [(0, 0), (6, 0), (12, 0), (18, 1), (24, 1)]
    # the group's own start-up answers came from the hosted workers
    assert [group._readiness.info[r]["pid"] for r in (0, 1)] == [i["pid"] for i in info]
    group.shutdown()


def test_an_error_in_a_hosted_worker_is_named_as_in_an_actor(ray_session: Any) -> None:
    pool = RayResourcePool([2], use_gpu=False)
    pool.prestart([])
    group = RayWorkerGroup(pool, RayClassWithInitArgs(HostedWorker), name_prefix="hosted_err")
    with pytest.raises(WorkerGroupError) as info:
        group.fail_on(1)
    error = info.value
    assert (error.group, error.rank, error.method) == ("hosted_err", 1, "fail_on")
    assert "ValueError: bad input on rank 1" in str(error)
    assert "raise ValueError" in error.details
    assert group.fail_on(5) == [0, 1]  # still works afterwards
    group.shutdown()


def test_a_class_that_cannot_be_hosted_ends_the_hosts_and_gets_actors(ray_session: Any) -> None:
    pool = RayResourcePool([1], use_gpu=False)
    pool.prestart([])
    (host,) = pool._hosts
    group = RayWorkerGroup(pool, RayClassWithInitArgs(AsyncWorker), name_prefix="not_hosted")
    assert group.workers != [host] and not group._hosted
    assert group.pid() == [group._readiness.info[0]["pid"]]
    with pytest.raises(ray_module.exceptions.RayActorError):
        ray_module.get(host.__ray_ready__.remote(), timeout=30)
    group.shutdown()


def test_a_preload_that_fails_is_named_when_the_group_starts(ray_session: Any) -> None:
    pool = RayResourcePool([1], use_gpu=False)
    pool.prestart(["no_such_module_for_hosts"])
    with pytest.raises(WorkerGroupError) as info:
        RayWorkerGroup(pool, RayClassWithInitArgs(HostedWorker), name_prefix="bad_preload")
    assert info.value.rank == 0 and info.value.method == "__init__"
    assert "no_such_module_for_hosts" in str(info.value)
    pool.release()


def test_unused_hosts_end_with_the_pool(ray_session: Any) -> None:
    pool = RayResourcePool([1], use_gpu=False)
    pool.prestart([])
    (host,) = pool._hosts
    ray_module.get(host.__ray_ready__.remote(), timeout=60)
    pool.release()
    assert pool.take_hosts() == []
    # The host ends with its placement group, which Ray removes asynchronously: a call made
    # at once may still be served (seen under load), so wait for the end, with a deadline.
    deadline = time.monotonic() + 60
    with pytest.raises(ray_module.exceptions.RayActorError):
        while time.monotonic() < deadline:
            ray_module.get(host.__ray_ready__.remote(), timeout=30)
            time.sleep(0.2)


def test_a_hosted_worker_names_itself_in_the_log_prefixes(
    ray_session: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray prefixes an actor's printed lines with the name it last announced; a host
    announces its worker's (``group rank r``) once the worker is built."""
    from hf_controller.ray.host import WorkerHost

    for key in ("RANK", "HF_CONTROLLER_GROUP"):  # the host sets them: restored afterwards
        monkeypatch.setenv(key, "")
    host = WorkerHost([])
    assert repr(host) == "worker host"
    host._hf_construct({"RANK": "0", "HF_CONTROLLER_GROUP": "named"}, HostedWorker, (), {})
    assert repr(host) == "named rank 0"
    captured = capsys.readouterr()
    assert ":actor_name:named rank 0" in captured.out.splitlines()
    assert ":actor_name:named rank 0" in captured.err.splitlines()
    assert host._hf_call("fail_on", 5) == 0
