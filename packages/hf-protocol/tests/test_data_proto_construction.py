"""Building DataProtos, inspecting them, and the errors bad input gets."""

from collections.abc import Callable

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from hf_protocol import DataProto, DataProtoItem


def test_from_dict_converts_lists_and_keeps_meta(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=6)
    assert len(data) == 6
    assert data.non_tensor_batch["uid"].dtype == object
    assert data.non_tensor_batch["tags"][2] == [0, 1]
    assert data.meta_info == {"temperature": 0.7, "global_step": 3}
    assert data.batch is not None and data.batch.batch_size == torch.Size([6])


def test_from_single_dict_routes_by_type() -> None:
    data = DataProto.from_single_dict(
        {"ids": torch.arange(3), "text": ["a", "b", "c"], "w": np.ones(3)}, meta_info={"k": 1}
    )
    assert data.batch is not None and list(data.batch.keys()) == ["ids"]
    assert set(data.non_tensor_batch) == {"text", "w"}
    assert data.meta_info == {"k": 1}


def test_non_tensor_only_and_empty_dataprotos_have_lengths() -> None:
    assert len(DataProto.from_dict(non_tensors={"s": ["a", "b"]})) == 2
    assert len(DataProto()) == 0


def test_mismatched_batch_sizes_name_every_column() -> None:
    with pytest.raises(ValueError, match=r"tensors\['a'\]\": 3, \"tensors\['b'\]\": 2"):
        DataProto.from_dict({"a": torch.zeros(3), "b": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"non_tensors\['s'\]\": 4"):
        DataProto.from_dict({"a": torch.zeros(3)}, {"s": ["x"] * 4})


def test_direct_construction_is_checked() -> None:
    batch = TensorDict({"a": torch.zeros(3)}, batch_size=[3])
    with pytest.raises(ValueError, match=r"non_tensor_batch\['s'\] has 2 rows but the batch has 3"):
        DataProto(batch=batch, non_tensor_batch={"s": np.array(["x", "y"])})
    with pytest.raises(ValueError, match="exactly one batch dimension"):
        DataProto(batch=TensorDict({"a": torch.zeros(3, 2)}, batch_size=[3, 2]))
    with pytest.raises(TypeError, match="meta_info must be a dict"):
        DataProto(meta_info=[1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_batch_dims=2"):
        DataProto.from_dict({"a": torch.zeros(3, 2)}, num_batch_dims=2)


def test_int_index_gives_an_item(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=5)
    item = data[-1]
    assert isinstance(item, DataProtoItem)
    assert item.batch is not None
    assert torch.equal(item.batch["input_ids"], data.batch["input_ids"][4])  # type: ignore[index]
    assert item.non_tensor_batch["uid"] == "prompt-2"
    assert item.meta_info["temperature"] == 0.7
    with pytest.raises(IndexError, match="index 5 is out of range for a DataProto of length 5"):
        data[5]


def test_slices_and_index_arrays(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=8)
    values = data.batch["values"]  # type: ignore[index]
    assert torch.equal(data[2:6:2].batch["values"], values[2:6:2])  # type: ignore[union-attr]
    picked = data[[7, 0, 7]]
    assert isinstance(picked, DataProto)
    assert torch.equal(picked.batch["values"], values[[7, 0, 7]])  # type: ignore[index]
    assert picked.non_tensor_batch["uid"].tolist() == ["prompt-3", "prompt-0", "prompt-3"]
    mask = np.arange(8) % 2 == 0
    assert len(data[mask]) == 4
    assert len(data[torch.from_numpy(mask)]) == 4
    assert len(data[np.array([1, 2])]) == 2
    with pytest.raises(TypeError, match="float"):
        data[1.5]  # type: ignore[index]


def test_slice_shares_memory_but_select_idxs_copies(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=4)
    data.slice(0, 2).batch["values"][0] = 42.0  # type: ignore[index]
    assert data.batch["values"][0] == 42.0  # type: ignore[index]
    data.select_idxs([0]).batch["values"][0] = -1.0  # type: ignore[index]
    assert data.batch["values"][0] == 42.0  # type: ignore[index]


def test_repr_lists_columns_with_shapes(make_batch: Callable[..., DataProto]) -> None:
    text = repr(make_batch(length=8))
    assert text.startswith("DataProto(len=8, nbytes=")
    assert "input_ids: int64[8, 4] cpu" in text
    assert "old_log_probs: bfloat16[8, 4] cpu" in text
    assert "uid: object[8]" in text
    assert "temperature=0.7" in text


def test_nbytes_counts_tensor_bytes() -> None:
    data = DataProto.from_dict({"a": torch.zeros(4, 2, dtype=torch.float32)})
    assert data.nbytes == 32


def test_to_moves_tensors_and_returns_self(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=2)
    assert data.to("cpu") is data
    assert data.batch is not None and data.batch.device == torch.device("cpu")


def test_none_non_tensor_batch_and_meta_info_mean_empty() -> None:
    labels = np.array(["a", "b"], dtype=object)
    data = DataProto(batch=None, non_tensor_batch=None, meta_info=None)  # type: ignore[arg-type]
    assert (len(data), data.non_tensor_batch, data.meta_info) == (0, {}, {})
    with_rows = DataProto(
        batch=TensorDict({"x": torch.zeros(2)}, batch_size=[2]),
        non_tensor_batch=None,  # type: ignore[arg-type]
        meta_info={"step": 1},
    )
    assert len(with_rows) == 2 and with_rows.non_tensor_batch == {}
    with_rows.non_tensor_batch["labels"] = labels  # the dict is a real, writable one
    joined = DataProto.concat([with_rows, with_rows])
    assert joined.non_tensor_batch["labels"].tolist() == ["a", "b", "a", "b"]
