"""hf_protocol.compat.verl and compat.verl_tensordict: verl's names over hf-protocol."""

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

import hf_protocol
import hf_protocol.compat.verl_tensordict as tu
from hf_protocol.compat.verl import (
    DataProto,
    DataProtoConfig,
    VerlCompatError,
    VerlCompatTypeError,
    collate_fn,
    deserialize_single_tensor,
    deserialize_tensordict,
    fold_batch_dim,
    list_of_dict_to_dict_of_list,
    serialize_single_tensor,
    serialize_tensordict,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
)


def _data(rows: int = 4) -> DataProto:
    return DataProto.from_dict(
        {"obs": torch.arange(rows)},
        {"labels": [f"l{i}" for i in range(rows)]},
        meta_info={"name": "x"},
    )


@pytest.fixture
def auto_padding_off(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("VERL_AUTO_PADDING", raising=False)
    before = DataProtoConfig.auto_padding
    DataProtoConfig.auto_padding = False
    yield
    DataProtoConfig.auto_padding = before


def test_compat_dataproto_is_an_hf_protocol_dataproto_and_keeps_its_type() -> None:
    data = _data()
    assert isinstance(data, hf_protocol.DataProto)
    for derived in (data[1:3], data.chunk(3)[0], DataProto.concat(data.chunk(2)), data.repeat(2)):
        assert type(derived) is DataProto
    assert type(pickle.loads(pickle.dumps(data))) is DataProto
    assert [len(part) for part in data.chunk(3)] == [2, 1, 1]  # uneven: balanced, no padding


@pytest.mark.usefixtures("auto_padding_off")
def test_auto_padding_flag_per_batch_per_class_and_from_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = _data()
    flagged = DataProto.from_dict({"a": torch.zeros(2)}, auto_padding=True)
    single = DataProto.from_single_dict({"a": torch.zeros(2)}, auto_padding=True)
    assert not plain.is_padding_enabled()
    assert flagged.is_padding_enabled() and single.is_padding_enabled()
    assert flagged.meta_info == {DataProtoConfig.auto_padding_key: True}
    DataProtoConfig.auto_padding = True
    assert plain.is_padding_enabled()
    DataProtoConfig.auto_padding = False
    monkeypatch.setenv("VERL_AUTO_PADDING", "true")
    assert DataProtoConfig.auto_padding and plain.is_padding_enabled()
    with pytest.raises(TypeError, match="must be a bool") as raised:
        DataProtoConfig.auto_padding = 1  # type: ignore[assignment]
    assert isinstance(raised.value, AssertionError)


def test_padding_appends_copies_of_the_first_or_last_row_in_place() -> None:
    data = _data(3)
    data.padding(2)
    assert data.batch["obs"].tolist() == [0, 1, 2, 2, 2]  # type: ignore[index]
    assert data.non_tensor_batch["labels"].tolist() == ["l0", "l1", "l2", "l2", "l2"]
    first = _data(3)
    first.padding(1, padding_candidate="first")
    assert first.batch["obs"].tolist() == [0, 1, 2, 0]  # type: ignore[index]
    untouched = _data(3)
    untouched.padding(0)
    assert len(untouched) == 3
    with pytest.raises(VerlCompatError, match="padding_size=-1"):
        untouched.padding(-1)


def test_errors_are_both_value_errors_and_assertion_errors() -> None:
    assert issubclass(VerlCompatError, ValueError) and issubclass(VerlCompatError, AssertionError)
    with pytest.raises(VerlCompatError, match="num_batch_dims=2"):
        DataProto.from_dict({"obs": torch.zeros(2, 2)}, num_batch_dims=2)
    with pytest.raises(VerlCompatTypeError, match="batch"):
        DataProto.from_dict({"obs": [1, 2]})  # type: ignore[dict-item]
    a = DataProto.from_dict({"obs": torch.zeros(1)}, meta_info={"config": "A"})
    b = DataProto.from_dict({"obs": torch.zeros(1)}, meta_info={"config": "B"})
    with pytest.raises(AssertionError, match="Conflicting values for meta_info key 'config'"):
        DataProto.concat([a, b])
    other = DataProto.from_dict({"obs": torch.ones(1)})
    with pytest.raises(ValueError, match="obs"):
        a.union(other)
    assert a.batch["obs"].tolist() == [0.0]  # type: ignore[index]


def test_concat_gathers_per_worker_metrics() -> None:
    parts = [
        DataProto.from_dict({"o": torch.zeros(1)}, meta_info={"metrics": [{"loss": 0.5}]}),
        DataProto.from_dict({"o": torch.zeros(1)}, meta_info={"metrics": {"loss": 0.6}}),
    ]
    assert DataProto.concat(parts).meta_info == {"metrics": {"loss": [0.5, 0.6]}}


def test_union_helpers_raise_assertion_compatible_errors_naming_the_key() -> None:
    obs = torch.randn(3, 2)
    left = TensorDict({"obs": obs}, batch_size=[3])
    assert union_tensor_dict(left, TensorDict({"obs": obs, "r": torch.ones(3)}, [3])) is left
    assert set(left.keys()) == {"obs", "r"}
    with pytest.raises(AssertionError, match="obs"):
        union_tensor_dict(left, TensorDict({"obs": obs + 1}, batch_size=[3]))
    arrays = {"x": np.array([1.0, np.nan])}
    assert union_numpy_dict(arrays, {"x": np.array([1.0, np.nan]), "y": np.zeros(2)}) is arrays
    with pytest.raises(AssertionError, match="`x` in tensor_dict1 and tensor_dict2"):
        union_numpy_dict(arrays, {"x": np.array([2.0, np.nan])})


def test_unfold_column_chunks_splits_named_columns_and_repeats_the_rest() -> None:
    data = DataProto.from_dict(
        {"grouped": torch.arange(8).reshape(2, 4), "other": torch.tensor([10, 20])},
        {"pairs": [["a1", "a2"], ["b1", "b2"]], "tag": ["a", "b"]},
        meta_info={"m": 1},
    )
    out = data.unfold_column_chunks(2, split_keys=["grouped", "pairs"])
    assert out.batch["grouped"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]  # type: ignore[index]
    assert out.batch["other"].tolist() == [10, 10, 20, 20]  # type: ignore[index]
    assert out.non_tensor_batch["pairs"].tolist() == [["a1"], ["a2"], ["b1"], ["b2"]]
    assert out.non_tensor_batch["tag"].tolist() == ["a", "a", "b", "b"]
    assert out.meta_info == {"m": 1} and type(out) is DataProto
    with pytest.raises(VerlCompatError, match="not divisible by n_split=3"):
        data.unfold_column_chunks(3, split_keys=["grouped"])
    with pytest.raises(VerlCompatError, match="'tag' needs a second dimension"):
        data.unfold_column_chunks(2, split_keys=["tag"])


def test_fold_and_unfold_functions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _data(4)
    folded = fold_batch_dim(data, new_batch_size=2)
    assert folded.batch["obs"].tolist() == [[0, 1], [2, 3]]  # type: ignore[index]
    assert unfold_batch_dim(folded).batch["obs"].tolist() == [0, 1, 2, 3]  # type: ignore[index]
    with pytest.raises(AssertionError, match="new_batch_size=3"):
        fold_batch_dim(data, new_batch_size=3)
    data.save_to_disk(tmp_path / "d.zip")
    loaded = DataProto.load_from_disk(tmp_path / "d.zip")
    assert type(loaded) is DataProto and loaded.meta_info == {"name": "x"}
    data.print_size(prefix="step")
    assert capsys.readouterr().out.startswith("step, Size of tensordict: ")
    data.meta_info.update(ids=[1, 2], cfg={"lr": 0.1}, pair=(1, "a"), empty={})
    assert data.get_data_info().splitlines() == [
        "batch",
        "  obs: (4,) (torch.int64) cpu",
        "non_tensor_batch",
        "  labels: ndarray(4,) (object)",
        "meta_info",
        "  name: str",
        "  ids: list[int]",
        "  cfg: dict[str: float]",
        "  pair: tuple(int, str)",
        "  empty: dict",
    ]


def test_serialize_helpers_round_trip_dtypes_nested_tensors_and_device() -> None:
    tensor = torch.randn(2, 3).to(torch.bfloat16)
    dtype, shape, raw = serialize_single_tensor(tensor)
    assert (dtype, shape, raw.dtype) == ("bfloat16", (2, 3), np.uint8)
    back = deserialize_single_tensor((dtype, shape, raw))
    assert torch.equal(back, tensor)
    back.add_(1)  # its own memory: the source is unchanged
    assert not torch.equal(back, tensor)
    nested = torch.nested.as_nested_tensor([torch.ones(2), torch.zeros(3)], layout=torch.jagged)
    td = TensorDict({"n": nested, "x": torch.arange(2)}, batch_size=[2], device="cpu")
    size, device, encoded = serialize_tensordict(td)
    assert (size, device, encoded["n"][0]) == ((2,), "cpu", "jagged")
    restored = deserialize_tensordict((size, device, encoded))
    assert [t.tolist() for t in restored["n"].unbind()] == [[1.0, 1.0], [0.0, 0.0, 0.0]]
    assert restored["x"].tolist() == [0, 1] and str(restored.device) == "cpu"
    with pytest.raises(ValueError, match="expected 3"):
        deserialize_tensordict(((1,), None, {"bad": (1,)}))


def test_collate_fn_and_list_of_dict_to_dict_of_list() -> None:
    data = _data(3)
    collated = collate_fn([data[2], data[0]])
    assert collated.batch["obs"].tolist() == [2, 0]  # type: ignore[index]
    assert collated.non_tensor_batch["labels"].tolist() == ["l2", "l0"]
    assert list_of_dict_to_dict_of_list([{"a": 1, "b": 2}, {"a": 3, "b": 4}]) == {
        "a": [1, 3],
        "b": [2, 4],
    }
    assert list_of_dict_to_dict_of_list([]) == {}


def test_get_tensordict_and_readers() -> None:
    td = tu.get_tensordict(
        {"obs": torch.arange(3), "scores": [[], [0.5], [0.9, 1.0]], "ids": np.array([4, 5, 6])},
        {"step": 7},
    )
    assert td.batch_size == torch.Size([3]) and isinstance(td.get("scores"), NonTensorStack)
    assert tu.get(td, "scores") == [[], [0.5], [0.9, 1.0]] and tu.get(td, "step") == 7
    assert tu.get(td, "missing", "d") == "d" and torch.equal(tu.get(td, "obs"), torch.arange(3))
    assert tu.get_non_tensor_data(td, "step", None) == 7
    assert tu.pop(td, "step") == 7 and "step" not in td
    assert tu.pop(td, "step", "gone") == "gone"
    tu.assign_non_tensor(td, tag=["a", "b", "c"], name="run")
    assert tu.get(td, "tag") == ["a", "b", "c"] and isinstance(td.get("name"), NonTensorData)
    assert tu.unwrap_non_tensor_data(NonTensorData(3)) == 3 and tu.unwrap_non_tensor_data(4) == 4
    assert tu.get_tensordict({}, {"only": 1}).batch_size == torch.Size([])
    with pytest.raises(AssertionError, match="different batch sizes"):
        tu.get_tensordict({"a": torch.zeros(2), "b": [1, 2, 3]})
    with pytest.raises(ValueError, match="holds tensors"):
        tu.get_tensordict({"a": [torch.zeros(1)]})
    with pytest.raises(ValueError, match="both a column and a value"):
        tu.get_tensordict({"a": [1]}, {"a": 2})


def test_contiguous_concat_and_chunk_with_nested_tensors() -> None:
    def part(lengths: list[int], start: int) -> TensorDict:
        rows = [torch.arange(n) + start for n in lengths]
        nested = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
        ids = torch.arange(len(lengths)) + start
        return tu.get_tensordict({"seq": nested, "id": ids}, {"step": 1})

    joined = tu.concat_tensordict([part([2, 1], 0), part([3], 10)])
    assert joined["id"].tolist() == [0, 1, 10]
    assert [t.tolist() for t in joined["seq"].unbind()] == [[0, 1], [0], [10, 11, 12]]
    chunks = tu.chunk_tensordict(joined, 2)
    assert [len(c) for c in chunks] == [2, 1]
    assert [t.tolist() for t in chunks[1]["seq"].unbind()] == [[10, 11, 12]]
    strided = tu.get_tensordict({"x": torch.arange(6).reshape(2, 3).t()}, {"step": 2})
    made = tu.contiguous(strided)
    assert made["x"].is_contiguous() and isinstance(made.get("step"), NonTensorData)
    meta_only = [tu.get_tensordict({}, {"s": 1}), tu.get_tensordict({}, {"s": 2})]
    assert tu.concat_tensordict(meta_only) is meta_only[0]
    with pytest.raises(ValueError, match="nested tensors"):
        tu.concat_tensordict([part([1], 0), tu.get_tensordict({"id": torch.zeros(1)})])


def test_nested_tensors_keep_their_ragged_dimension_through_chunk_and_concat() -> None:
    # mRoPE-style position ids: (4, seq_len) per sample, ragged in the last dimension
    rows = [torch.arange(n).expand(4, n).contiguous() for n in (4, 4, 6)]
    position_ids = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    td = tu.get_tensordict({"position_ids": position_ids, "i": torch.arange(3)})
    first, second = tu.chunk_tensordict(td, 2)
    assert first["position_ids"]._ragged_idx == 2  # equal lengths in this part, same layout
    joined = tu.concat_tensordict([first, second])
    assert [tuple(t.shape) for t in joined["position_ids"].unbind()] == [(4, 4), (4, 4), (4, 6)]
    built = tu.nested_tensor_from_tensor_list([torch.ones(2), torch.ones(3)])
    assert built.shape[0] == 2 and built._ragged_idx == 1
    with pytest.raises(ValueError, match=r"ragged_idx must be in \[1, 1\]"):
        tu.nested_tensor_from_tensor_list([torch.ones(2)], ragged_idx=2)
    with pytest.raises(ValueError, match="cannot fill 4 parts"):
        tu.chunk_tensordict(td, 4)


def test_key_subsets_row_selection_and_padding_of_tensordicts() -> None:
    seq = torch.nested.as_nested_tensor([torch.arange(n) for n in (1, 2, 3)], layout=torch.jagged)
    td = tu.get_tensordict({"x": torch.arange(3), "seq": seq, "tag": ["a", "b", "c"]}, {"s": 5})
    picked = tu.get_keys(td, ["tag", "s"])
    assert tu.get(picked, "tag") == ["a", "b", "c"] and tu.get(picked, "s") == 5
    assert "tag" in td
    with pytest.raises(KeyError, match="'nope'"):
        tu.get_keys(td, ["x", "nope"])
    selected = tu.index_select_tensor_dict(td, [2, 0, 2])
    assert selected["x"].tolist() == [2, 0, 2] and tu.get(selected, "tag") == ["c", "a", "c"]
    assert [t.tolist() for t in selected["seq"].unbind()] == [[0, 1, 2], [0], [0, 1, 2]]
    assert tu.get(selected, "s") == 5
    padded, pad_size = tu.pad_to_divisor(td, 2)
    assert pad_size == 1 and padded["x"].tolist() == [0, 1, 2, 0]
    assert tu.unpad(padded, pad_size)["x"].tolist() == [0, 1, 2]
    assert tu.pad_to_divisor(td, 3) == (td, 0) and tu.unpad(td, 0) is td
    popped = tu.pop_keys(td, ["x"])
    assert popped["x"].tolist() == [0, 1, 2] and "x" not in td
