"""RayWorkerGroup on a real local Ray with CPU resource pools: every dispatch and execute mode."""

import asyncio
import os
import threading
from typing import Any

import pytest
import ray as ray_module
from rows import Rows

from hf_controller import (
    ConfigurationError,
    Dispatch,
    Execute,
    GroupFuture,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    register,
)


@ray_module.remote
class MyWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def compute(self, x):  # type: ignore[no-untyped-def]
        return x + self.rank


def dispatch_to_even_ranks(group: Any, value: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return ([value if rank % 2 == 0 else None for rank in range(group.world_size)],), {}


def collect_non_none(group: Any, outputs: list[Any]) -> list[Any]:
    return [o for o in outputs if o is not None]


class DataWorker(Worker):
    """A plain class (no @ray.remote): the group wraps it."""

    def __init__(self, scale: int = 1) -> None:
        super().__init__()
        self.scale = scale

    @register(Dispatch.DP_COMPUTE_PROTO)
    def double(self, batch: Rows) -> Rows:
        return Rows([(v * 2 * self.scale, self.rank) for v in batch.values])

    @register(Dispatch.DP_COMPUTE_PROTO, pad_to_equal=True)
    def sizes(self, batch: Rows) -> Rows:
        return Rows([len(batch)] * len(batch))

    @register(Dispatch.DP_COMPUTE_METRIC)
    def count(self, batch: Rows) -> int:
        return len(batch)

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_later(self, batch: Rows) -> Rows:
        return Rows([v * 2 for v in batch.values])

    @register(Dispatch.DP_COMPUTE_PROTO)
    def plus_one(self, batch: Rows) -> Rows:
        return Rows([v + 1 for v in batch.values])

    @register(Dispatch.ALL_TO_ALL)
    def pick(self, value: Any) -> Any:
        return (self.rank, value)

    @register(Dispatch.DP_COMPUTE)
    def pick_dp(self, value: Any) -> Any:
        return value * 10

    @register({"dispatch_fn": dispatch_to_even_ranks, "collect_fn": collect_non_none})
    def maybe_square(self, value: int | None) -> int | None:
        return None if value is None else value * value + self.rank

    @register(Dispatch.RANK_ZERO)
    def leader(self) -> int:
        return self.rank

    @register(Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def leader_echo(self, x: int) -> tuple[int, int]:
        return self.rank, x

    @register(Dispatch.ONE_TO_ALL)
    async def slow_async(self, delay: float) -> int:
        await asyncio.sleep(delay)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def env(self) -> dict[str, str]:
        keys = (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "EXTRA",
        )
        return {k: os.environ.get(k, "") for k in keys}


@pytest.fixture(scope="module")
def data_group(ray_session: Any) -> RayWorkerGroup:
    pool = RayResourcePool([4], use_gpu=False, name_prefix="data_pool")
    return RayWorkerGroup(
        pool, RayClassWithInitArgs(DataWorker, scale=1), worker_env={"EXTRA": "yes"}
    )


def test_design_example_runs_as_written(ray_session: Any) -> None:
    pool = RayResourcePool([4], use_gpu=False)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(cls=MyWorker))
    assert wg.compute(x=10) == [10, 11, 12, 13]


def test_uneven_batch_is_split_and_gathered_in_order(data_group: RayWorkerGroup) -> None:
    out = data_group.double(Rows(range(10)))
    assert [v for v, _ in out.values] == [2 * i for i in range(10)]
    assert [rank for _, rank in out.values] == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    assert data_group.count(Rows(range(10))) == [3, 3, 2, 2]


def test_padding_gives_equal_shards_and_is_dropped(data_group: RayWorkerGroup) -> None:
    out = data_group.sizes(Rows(range(10)))
    assert out.values == [3] * 10  # every worker saw 3 rows; the 2 padded rows are gone


def test_all_to_all_dp_compute_and_rank_zero(data_group: RayWorkerGroup) -> None:
    assert data_group.pick(["a", "b", "c", "d"]) == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]
    assert data_group.pick_dp([1, 2, 3, 4]) == [10, 20, 30, 40]
    assert data_group.leader() == 0
    assert data_group.maybe_square(3) == [9, 11]  # inline custom mode: ranks 0 and 2
    assert data_group.leader_echo(5) == (0, 5)


def test_async_methods_run_concurrently_on_workers(data_group: RayWorkerGroup) -> None:
    assert data_group.slow_async(0.01) == [0, 1, 2, 3]


def test_environment_for_torch_distributed(data_group: RayWorkerGroup) -> None:
    envs = data_group.env()
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"} and {e["LOCAL_WORLD_SIZE"] for e in envs} == {
        "4"
    }
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1 and envs[0]["MASTER_PORT"].isdigit()
    assert {e["EXTRA"] for e in envs} == {"yes"}


def test_worker_env_cannot_override_rank_variables(ray_session: Any) -> None:
    pool = RayResourcePool([1], use_gpu=False)
    with pytest.raises(ConfigurationError, match=r"worker_env cannot set \['RANK'\]"):
        RayWorkerGroup(pool, RayClassWithInitArgs(DataWorker), worker_env={"RANK": "7"})


def test_non_blocking_returns_a_future_resolved_by_the_next_group(
    data_group: RayWorkerGroup, ray_session: Any
) -> None:
    other = RayWorkerGroup(RayResourcePool([3], use_gpu=False), RayClassWithInitArgs(DataWorker))
    future = data_group.double_later(Rows(range(7)))
    assert isinstance(future, GroupFuture)
    assert other.plus_one(future) == Rows([2 * i + 1 for i in range(7)])


def test_execute_all_helpers(data_group: RayWorkerGroup) -> None:
    assert data_group.execute_all_sync("_hf_master_address")[0][0] == "127.0.0.1"
    assert data_group.execute_rank_zero_sync("leader") == 0


def test_calls_are_timed_and_exported(data_group: RayWorkerGroup, tmp_path: Any) -> None:
    import json

    data_group.double(Rows(range(4)))
    phases = {(t.method, t.phase) for t in data_group.timings}
    assert {("double", "dispatch"), ("double", "execute"), ("double", "collect")} <= phases
    path = data_group.export_trace(tmp_path / "trace.json")
    with open(path) as handle:
        events = json.load(handle)["traceEvents"]
    spans = [e for e in events if e["ph"] == "X" and e["name"] == "double"]
    assert {e["cat"] for e in spans} == {"dispatch", "execute", "collect"}
    assert all(e["dur"] >= 0 for e in spans)


def test_ray_runs_on_loopback(ray_session: Any) -> None:
    assert {n["NodeManagerAddress"] for n in ray_session.nodes() if n["Alive"]} == {"127.0.0.1"}


def test_non_blocking_start_then_calls_and_views_wait_for_the_workers(ray_session: Any) -> None:
    group = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False),
        RayClassWithInitArgs(DataWorker),
        block_until_ready=False,
    )
    try:
        envs = group.env()  # the first call waits for both workers to be up
        assert [e["RANK"] for e in envs] == ["0", "1"]
        assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}  # found in the driver
        group.wait_ready()  # already done: returns at once
    finally:
        group.shutdown()


BACKGROUND_START = """
import ray
from hf_controller import ensure_ray, start_ray_in_background

start_ray_in_background(no_such_ray_init_argument=1)
try:
    ensure_ray()
except RuntimeError as error:  # Ray: "Unknown keyword argument(s)"
    print("raised:", "no_such_ray_init_argument" in str(error))
start_ray_in_background(num_cpus=1, log_to_driver=False)
start_ray_in_background()  # a second call before ensure_ray: nothing more starts
import threading
errors = []

def connect():
    try:
        ensure_ray()  # each waits for the background start; none starts a Ray of its own
    except Exception as error:
        errors.append(repr(error))

threads = [threading.Thread(target=connect) for _ in range(2)]
for thread in threads:
    thread.start()
ensure_ray()  # waits for the background start
for thread in threads:
    thread.join()
print("initialised:", ray.is_initialized(), ray.cluster_resources().get("CPU"), errors)
ray.shutdown()
"""


def test_start_ray_in_background_hands_its_result_to_ensure_ray(tmp_path: Any) -> None:
    import subprocess
    import sys

    # A fresh process: this one already runs the session's Ray.
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    result = subprocess.run(
        [sys.executable, "-c", BACKGROUND_START],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "raised: True" in result.stdout
    assert "initialised: True 1.0 []" in result.stdout


def test_a_second_background_start_while_ray_is_half_imported_does_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first call's thread imports Ray; a second call meanwhile sees a module without
    ``is_initialized`` yet and must return, not raise AttributeError."""
    import sys
    import types

    from hf_controller.ray import cluster

    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))  # half-imported
    monkeypatch.setattr(cluster, "_background", object())  # a start under way
    cluster.start_ray_in_background()
    assert cluster._background is not None


class EnvWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        self._meeting = threading.Barrier(2, timeout=20)

    @register(Dispatch.ONE_TO_ALL)
    def env(self, key: str) -> str:
        return os.environ.get(key, "unset")

    def meet(self) -> bool:
        """Returns once a second call is inside it too (needs max_concurrency >= 2)."""
        self._meeting.wait()
        return True


@pytest.mark.parametrize(
    "options",
    [{"max_concurrency": 2}, {"runtime_env": {"env_vars": {"FROM_CLASS": "yes"}}}],
    ids=["options-kept", "runtime-env-kept"],
)
def test_a_decorated_class_keeps_its_options_and_gets_the_rank_env(
    ray_session: Any, options: dict[str, Any]
) -> None:
    decorated = ray_module.remote(**options)(EnvWorker)
    group = RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(decorated))
    assert group.env("RANK") == ["0", "1"]
    assert group.env("RAY_LOCAL_WORLD_SIZE") == ["2", "2"]
    expected = "yes" if "runtime_env" in options else "unset"
    assert group.env("FROM_CLASS") == [expected, expected]
    if "max_concurrency" in options:  # two calls run at once on one actor
        calls = [group.execute_rank_zero_async("meet") for _ in range(2)]
        assert ray_session.get(calls, timeout=30) == [True, True]
    group.shutdown()
