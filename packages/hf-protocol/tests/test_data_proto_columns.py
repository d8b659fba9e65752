"""select, pop, rename and union: column operations and their guarantees."""

from collections.abc import Callable

import pytest
import torch

from hf_protocol import DataProto
from hf_protocol.testing import assert_dataproto_equal


def test_select_keeps_named_columns(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=4)
    picked = data.select(batch_keys=["values"], non_tensor_batch_keys=["uid"], meta_info_keys=[])
    assert picked.batch is not None and list(picked.batch.keys()) == ["values"]
    assert list(picked.non_tensor_batch) == ["uid"]
    assert picked.meta_info == {}
    everything = data.select()
    assert_dataproto_equal(everything, data)


def test_select_deepcopy_detaches_from_source(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=4)
    shallow = data.select(batch_keys=["values"])
    deep = data.select(batch_keys=["values"], non_tensor_batch_keys=["tags"], deepcopy=True)
    deep.batch["values"][0] = 99.0  # type: ignore[index]
    deep.non_tensor_batch["tags"][2].append(7)
    assert data.batch["values"][0] != 99.0  # type: ignore[index]
    assert data.non_tensor_batch["tags"][2] == [0, 1]
    shallow.batch["values"][0] = 99.0  # type: ignore[index]
    assert data.batch["values"][0] == 99.0  # type: ignore[index]


def test_select_unknown_key_lists_available(make_batch: Callable[..., DataProto]) -> None:
    with pytest.raises(KeyError, match=r"batch has no key\(s\) \['nope'\]; available: \["):
        make_batch().select(batch_keys=["nope"])


def test_pop_moves_columns_out(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=4)
    popped = data.pop(
        batch_keys=["values"], non_tensor_batch_keys=["uid"], meta_info_keys=["global_step"]
    )
    assert popped.batch is not None and list(popped.batch.keys()) == ["values"]
    assert list(popped.non_tensor_batch) == ["uid"] and popped.meta_info == {"global_step": 3}
    assert "values" not in data.batch  # type: ignore[union-attr]
    assert "uid" not in data.non_tensor_batch and "global_step" not in data.meta_info
    assert len(popped) == len(data) == 4


def test_failed_pop_removes_nothing(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=4)
    before = data.select(deepcopy=True)
    with pytest.raises(KeyError, match="missing"):
        data.pop(batch_keys=["values"], non_tensor_batch_keys=["missing"])
    assert_dataproto_equal(data, before)


def test_pop_then_union_restores_the_batch(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=5)
    original = data.select(deepcopy=True)
    popped = data.pop(batch_keys=["values", "input_ids"], non_tensor_batch_keys=["tags"])
    data.union(popped)
    assert_dataproto_equal(data, original)


def test_rename_batch_and_non_tensor_keys(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=3)
    assert data.rename(["values", "uid"], ["v", "group"]) is data
    assert "v" in data.batch and "values" not in data.batch  # type: ignore[union-attr]
    assert "group" in data.non_tensor_batch and "uid" not in data.non_tensor_batch
    with pytest.raises(ValueError, match="would overwrite"):
        data.rename("v", "input_ids")
    with pytest.raises(KeyError, match="nope"):
        data.rename("nope", "x")
    with pytest.raises(ValueError, match="1 old keys"):
        data.rename(["v"], ["a", "b"])


def test_union_adds_columns_and_meta(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=3)
    extra = DataProto.from_dict(
        {"ref_log_prob": torch.zeros(3, 4), "values": data.batch["values"].clone()},  # type: ignore[index]
        {"note": ["a", "b", "c"]},
        {"temperature": 0.7, "step_time": 1.5},
    )
    assert data.union(extra) is data
    assert "ref_log_prob" in data.batch  # type: ignore[union-attr]
    assert data.non_tensor_batch["note"].tolist() == ["a", "b", "c"]
    assert data.meta_info["step_time"] == 1.5


@pytest.mark.parametrize(
    ("tensors", "non_tensors", "meta", "message"),
    [
        ({"values": torch.full((3,), 9.0)}, {}, {}, r"\['values'\] exist in both"),
        ({}, {"uid": ["x", "y", "z"]}, {}, r"\['uid'\] exist in both"),
        (
            {"extra": torch.zeros(3)},
            {},
            {"temperature": 1.0},
            r"meta_info key\(s\) \['temperature'\]",
        ),
    ],
)
def test_conflicting_union_names_the_key_and_changes_nothing(
    make_batch: Callable[..., DataProto], tensors: dict, non_tensors: dict, meta: dict, message: str
) -> None:
    data = make_batch(length=3)
    before = data.select(deepcopy=True)
    other = DataProto.from_dict(tensors or {"fresh": torch.zeros(3)}, non_tensors, meta)
    with pytest.raises(ValueError, match=message):
        data.union(other)
    assert_dataproto_equal(data, before)


def test_union_of_different_lengths_is_rejected(make_batch: Callable[..., DataProto]) -> None:
    with pytest.raises(ValueError, match=r"lengths differ \(3 vs 4\)"):
        make_batch(length=3).union(make_batch(length=4))


def test_union_into_non_tensor_only_dataproto_takes_the_batch() -> None:
    data = DataProto.from_dict(non_tensors={"s": ["a", "b"]})
    data.union(DataProto.from_dict({"t": torch.arange(2)}))
    assert data.batch is not None and torch.equal(data.batch["t"], torch.arange(2))
