"""Dispatch modes and argument sharding, without any backend."""

from dataclasses import dataclass
from typing import Any

import pytest
from rows import Rows

from hf_controller import Dispatch, Execute, register, register_dispatch_mode, update_dispatch_mode
from hf_controller.decorator import method_spec
from hf_controller.dispatch import resolve_dispatch_mode
from hf_controller.sharding import pad_to_multiple, shard, unpad


@dataclass
class FakeGroup:
    world_size: int

    def dp_layout(self, mesh_name: str) -> tuple[list[int], list[bool]]:
        return [0, 0, 1, 1], [True, False, True, False]  # tp=2 inside dp=2


def run(mode: Any, group: FakeGroup, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    fns = resolve_dispatch_mode(mode)
    return fns["dispatch_fn"](group, *args, **kwargs)


def test_dp_compute_proto_splits_ten_rows_three_three_two_two() -> None:
    args, kwargs = run(
        Dispatch.DP_COMPUTE_PROTO, FakeGroup(4), Rows(range(10)), extra=Rows("abcdefghij")
    )
    assert [len(p) for p in args[0]] == [3, 3, 2, 2]
    assert kwargs["extra"][3] == Rows("ij")
    collect = resolve_dispatch_mode(Dispatch.DP_COMPUTE_PROTO)["collect_fn"]
    assert collect(FakeGroup(4), args[0]) == Rows(range(10))


def test_one_to_all_and_all_to_all() -> None:
    args, kwargs = run(Dispatch.ONE_TO_ALL, FakeGroup(3), 5, y="a")
    assert args == ([5, 5, 5],) and kwargs == {"y": ["a", "a", "a"]}
    args, _ = run(Dispatch.ALL_TO_ALL, FakeGroup(2), [1, 2])
    assert args == ([1, 2],)
    with pytest.raises(
        ValueError, match=r"argument 0 must be a list with one entry per worker \(2\), got 3"
    ):
        run(Dispatch.DP_COMPUTE, FakeGroup(2), [1, 2, 3])


def test_unshardable_argument_names_the_fix() -> None:
    with pytest.raises(TypeError, match=r"argument 0 is a int, which cannot be split.*ONE_TO_ALL"):
        run(Dispatch.DP_COMPUTE_PROTO, FakeGroup(2), 7)


def test_with_func_sends_the_function_everywhere() -> None:
    args, _ = run(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, FakeGroup(2), len, Rows([1, 2, 3]))
    assert args[0] == [len, len] and args[1] == [Rows([1, 2]), Rows([3])]


def test_mesh_dispatch_replicates_within_tp_and_collects_collect_ranks() -> None:
    from hf_controller import make_nd_compute_dataproto_dispatch_fn

    mode = make_nd_compute_dataproto_dispatch_fn("train")
    args, _ = mode["dispatch_fn"](FakeGroup(4), Rows(range(5)))
    assert args[0] == [Rows([0, 1, 2]), Rows([0, 1, 2]), Rows([3, 4]), Rows([3, 4])]
    gathered = mode["collect_fn"](
        FakeGroup(4), [Rows(["a"]), Rows(["x"]), Rows(["b"]), Rows(["y"])]
    )
    assert gathered == Rows(["a", "b"])


def test_named_modes_can_be_added_and_replaced() -> None:
    def dispatch_first_only(group: Any, value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return ([value] + [None] * (group.world_size - 1),), {}

    def collect_sum(group: Any, outputs: list[Any]) -> Any:
        return sum(o for o in outputs if o is not None)

    register_dispatch_mode("first_only_test", dispatch_first_only, collect_sum)
    with pytest.raises(ValueError, match="already exists"):
        register_dispatch_mode("first_only_test", dispatch_first_only, collect_sum)
    assert run("first_only_test", FakeGroup(3), 4) == (([4, None, None],), {})
    update_dispatch_mode("first_only_test", dispatch_first_only, lambda g, o: "replaced")
    assert resolve_dispatch_mode("first_only_test")["collect_fn"](FakeGroup(1), []) == "replaced"
    with pytest.raises(KeyError, match="unknown dispatch mode 'nope'"):
        resolve_dispatch_mode("nope")


def test_register_validates_and_records_metadata() -> None:
    class W:
        @register(Dispatch.DP_COMPUTE_PROTO, execute_mode=Execute.RANK_ZERO, blocking=False)
        def f(self, x: int) -> int:
            return x

    spec = method_spec(W.f)
    assert spec is not None and spec.dispatch_mode is Dispatch.DP_COMPUTE_PROTO
    assert spec.execute_mode is Execute.RANK_ZERO and spec.blocking is False
    assert W().f(3) == 3
    with pytest.raises(ValueError, match="missing \\['collect_fn'\\]"):
        register({"dispatch_fn": print})
    with pytest.raises(TypeError, match="execute_mode"):
        register(Dispatch.ONE_TO_ALL, execute_mode="all")  # type: ignore[arg-type]


def test_padding_makes_equal_shards_and_is_removed() -> None:
    padded, padding = pad_to_multiple(Rows(range(10)), 4)
    assert len(padded) == 12 and padded.values[10:] == [0, 1]
    parts, _ = shard(padded, 4)
    assert {len(p) for p in parts} == {3}
    assert unpad(padded, padding) == Rows(range(10))
    tiny, padding = pad_to_multiple(Rows([7]), 4)
    assert tiny == Rows([7, 7, 7, 7]) and padding.pad_size == 3
    with pytest.raises(ValueError, match="one output row per input row"):
        unpad(Rows([1]), padding)


def test_split_balanced_is_the_building_block_of_chunk() -> None:
    from hf_controller import split_balanced

    assert [len(p) for p in split_balanced(list(range(10)), 4)] == [3, 3, 2, 2]
    assert split_balanced("abc", 5) == ["a", "b", "c", "", ""]
    with pytest.raises(ValueError, match="got 0"):
        split_balanced([1], 0)


def test_a_broadcast_shares_one_call_and_per_rank_data_gets_its_own() -> None:
    from hf_controller.ray.relay import pack_calls
    from hf_controller.worker_group import _calls_for

    tag, ranks = object(), list(range(64))
    shared = _calls_for(ranks, [[tag] * 64], {"k": [1] * 64})
    assert len(shared) == 64 and all(call is shared[0] for call in shared)
    assert shared[0] == ((tag,), {"k": 1})
    assert pack_calls(shared) == (shared[0], None)  # sent once, whatever the rank count

    rows = [Rows([r]) for r in ranks]
    own = _calls_for(ranks, [rows], {"k": [1] * 64})
    assert [args[0].values for args, _ in own] == [[r] for r in ranks]
    assert len({id(call) for call in own}) == 64


def test_tensordict_splits_balanced_and_joins_with_torch_cat() -> None:
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")
    from hf_controller.futures import concat_parts

    batch = tensordict.TensorDict({"x": torch.arange(5.0)}, batch_size=[5])
    args, _ = run(Dispatch.DP_COMPUTE_PROTO, FakeGroup(4), batch)
    # TensorDict.chunk(4) on 5 rows would give 2/2/1 (three parts); the split is 2/1/1/1
    assert [len(part) for part in args[0]] == [2, 1, 1, 1]
    joined = concat_parts(args[0])
    assert isinstance(joined, tensordict.TensorDict)
    assert joined["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
