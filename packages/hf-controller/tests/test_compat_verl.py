"""hf_controller.compat.verl: verl's names and semantics, on a real Ray (one per session)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from hf_controller.compat.verl import (
    Dispatch,
    Execute,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    VerlCheckError,
    Worker,
    create_colocated_worker_raw_cls,
    get_device_name,
    get_nccl_backend,
    make_nd_compute_dataproto_dispatch_fn,
    parallel_put,
    register,
    register_dispatch_mode,
)
from hf_controller.dispatch import collect_all_to_all, dispatch_one_to_all

torch = pytest.importorskip("torch")
tensordict = pytest.importorskip("tensordict")
hf_protocol = pytest.importorskip("hf_protocol")

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(300)]


def _doubled_collect(worker_group: Any, outputs: list[Any]) -> list[Any]:
    return [2 * out for out in outputs]


DOUBLED = register_dispatch_mode("COMPAT_TEST_DOUBLED", dispatch_one_to_all, _doubled_collect)


class RankZeroView(Worker):
    """The part of VerlStyleWorker that a Ray task attaches to (a task does not know the
    dispatch modes registered in the driver)."""

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def sum_on_rank_zero(self, x: int, y: int) -> tuple[int, int]:
        return self.rank, x + y


class VerlStyleWorker(RankZeroView):
    """Two ranks; mesh "half": both dp rank 0, only rank 0 gathered."""

    def __init__(self, offset: int) -> None:
        super().__init__()
        self.offset = offset
        self._register_dispatch_collect_info("half", dp_rank=0, is_collect=self.rank == 0)

    @register(Dispatch.DP_COMPUTE_PROTO)
    def add_rank(self, data: Any) -> Any:
        data["out"] = data["x"] + self.offset + self.rank
        return data

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def add_rank_later(self, data: Any) -> Any:
        data.batch["out"] = data.batch["x"] + self.rank
        return data

    @register(make_nd_compute_dataproto_dispatch_fn("half"))
    def tag(self, data: Any) -> Any:
        data["rank"] = torch.full((len(data),), self.rank)
        return data

    @register(dispatch_mode=DOUBLED)
    def rank_plus(self, x: int) -> int:
        return self.rank + x

    def env(self, key: str) -> str:
        return os.environ.get(key, "unset")


@pytest.fixture(scope="module")
def group(ray_session: Any) -> Iterator[RayWorkerGroup]:
    wg = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False),
        RayClassWithInitArgs(VerlStyleWorker, offset=10),
        device_name=get_device_name(),
    )
    yield wg
    wg.shutdown()


def test_worker_copies_mesh_layouts_verls_way() -> None:
    source = Worker()
    source._register_dispatch_collect_info("actor", dp_rank=3, is_collect=False)
    layout = source.get_dispatch_collect()
    assert layout == {"dispatch_dp_rank": {"actor": 3}, "collect_dp_rank": {"actor": False}}
    fused = Worker()
    fused.set_dispatch_collect("ref", **layout)
    assert fused._query_dispatch_info("ref") == 3
    assert fused._query_collect_info("ref") is False
    with pytest.raises(VerlCheckError, match="'ref' is already registered") as error:
        fused.set_dispatch_collect("ref", **layout)
    assert isinstance(error.value, ValueError) and isinstance(error.value, AssertionError)
    two = {"dispatch_dp_rank": {"a": 0, "b": 1}, "collect_dp_rank": {"a": True, "b": False}}
    with pytest.raises(ValueError, match="exactly one mesh"):
        fused.set_dispatch_collect("other", **two)


def test_device_helpers_answer_for_this_machine() -> None:
    gpu = torch.cuda.is_available()
    assert get_device_name() == ("cuda" if gpu else "cpu")
    assert get_nccl_backend() == ("nccl" if gpu else "gloo")


def test_parallel_put_keeps_order_and_refuses_nothing(ray_session: Any) -> None:
    data = [1, "two", {"three": 3}, [4]]
    assert ray_session.get(parallel_put(data, max_workers=2)) == data
    with pytest.raises(VerlCheckError, match="empty data_list"):
        parallel_put([])


def test_workers_see_ray_local_world_size(group: RayWorkerGroup) -> None:
    assert group.execute_all_sync("env", key="RAY_LOCAL_WORLD_SIZE") == ["2", "2"]
    assert group.device_name == get_device_name()


def test_tensordict_in_and_out_of_a_dp_method(group: RayWorkerGroup) -> None:
    batch = tensordict.TensorDict({"x": torch.arange(5.0)}, batch_size=[5])
    out = group.add_rank(batch)  # 3 rows to rank 0, 2 to rank 1
    assert isinstance(out, tensordict.TensorDict)
    assert out["out"].tolist() == [10.0, 11.0, 12.0, 14.0, 15.0]


def test_non_blocking_dp_call_returns_a_data_proto_future(group: RayWorkerGroup) -> None:
    data = hf_protocol.DataProto.from_dict({"x": torch.zeros(4)})
    future = group.add_rank_later(data)
    assert isinstance(future, hf_protocol.DataProtoFuture)
    assert future.get().batch["out"].tolist() == [0.0, 0.0, 1.0, 1.0]


def test_mesh_layout_is_asked_in_verls_two_queries(group: RayWorkerGroup) -> None:
    assert group._query_dispatch_info("half") == [0, 0]
    assert group._query_collect_info("half") == [True, False]
    out = group.tag(tensordict.TensorDict({"x": torch.zeros(3)}, batch_size=[3]))
    assert out["rank"].tolist() == [0, 0, 0]  # one dp rank; only rank 0 is gathered


def test_all_to_all_on_rank_zero_gets_the_arguments_as_they_are(group: RayWorkerGroup) -> None:
    assert group.sum_on_rank_zero(x=1, y=2) == (0, 3)


def test_registered_mode_is_a_dispatch_attribute(group: RayWorkerGroup) -> None:
    assert Dispatch.COMPAT_TEST_DOUBLED == "COMPAT_TEST_DOUBLED"  # type: ignore[attr-defined]
    assert group.rank_plus(1) == [2, 4]
    with pytest.raises(ValueError, match="already exists"):
        register_dispatch_mode("COMPAT_TEST_DOUBLED", dispatch_one_to_all, collect_all_to_all)


def test_workers_are_named_for_from_detached_in_a_ray_task(
    ray_session: Any, group: RayWorkerGroup
) -> None:
    assert len(group.worker_names) == 2

    @ray_session.remote(num_cpus=0)
    def call_from_task(names: list[str]) -> tuple[int, int]:
        attached = RayWorkerGroup.from_detached(
            worker_names=names, ray_cls_with_init=RayClassWithInitArgs(RankZeroView)
        )
        return attached.sum_on_rank_zero(x=2, y=3)  # type: ignore[no-any-return]

    assert ray_session.get(call_from_task.remote(group.worker_names)) == (0, 5)


class Adder(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def add(self, x: int) -> int:
        return x + 1


class Doubler(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def double(self, x: int) -> int:
        siblings = self.fused_worker_dict
        assert self.get_fused_worker_by_name("adder") is siblings["adder"]
        return 2 * x


ROLES = {"adder": RayClassWithInitArgs(Adder), "doubler": RayClassWithInitArgs(Doubler)}


class AddThenDouble(create_colocated_worker_raw_cls(ROLES)):  # type: ignore[misc]
    @register(Dispatch.ONE_TO_ALL)
    def add_then_double(self, x: int) -> int:
        return int(self.doubler.double(self.adder.add(x)))


def test_fused_raw_class_reaches_its_roles_as_attributes(ray_session: Any) -> None:
    fused = RayWorkerGroup(RayResourcePool([1], use_gpu=False), RayClassWithInitArgs(AddThenDouble))
    fused.fuse(ROLES.keys())
    assert fused.add_then_double(3) == [8]
    assert fused.doubler.double(fused.adder.add(3)[0]) == [8]
    fused.shutdown()
