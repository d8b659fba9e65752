from collections.abc import Callable

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from hf_protocol import (
    DataProto,
    pad_dataproto_to_divisor,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)
from hf_protocol.testing import assert_dataproto_equal


def test_pad_cycles_rows_and_unpad_restores(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=5)
    padded, pad_size = pad_dataproto_to_divisor(data, 4)
    assert (len(padded), pad_size) == (8, 3)
    assert padded.non_tensor_batch["score"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert_dataproto_equal(unpad_dataproto(padded, pad_size), data)
    small, pad = pad_dataproto_to_divisor(make_batch(length=2), 7)
    assert small.non_tensor_batch["score"].tolist() == [0, 1, 0, 1, 0, 1, 0] and pad == 5


def test_pad_edge_cases(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=4)
    same, pad = pad_dataproto_to_divisor(data, 2)
    assert same is data and pad == 0
    assert unpad_dataproto(data, 0) is data
    with pytest.raises(ValueError, match="size_divisor"):
        pad_dataproto_to_divisor(data, 0)
    empty = make_batch(length=0)
    assert pad_dataproto_to_divisor(empty, 3) == (empty, 0)
    with pytest.raises(ValueError, match=r"pad_size must be in \[0, 4\]"):
        unpad_dataproto(data, 5)


def test_union_tensor_dict_in_place_and_checked() -> None:
    left = TensorDict({"a": torch.zeros(2)}, batch_size=[2])
    right = TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, batch_size=[2])
    assert union_tensor_dict(left, right) is left
    assert set(left.keys()) == {"a", "b"}
    with pytest.raises(ValueError, match="batch sizes differ"):
        union_tensor_dict(left, TensorDict({}, batch_size=[3]))
    with pytest.raises(ValueError, match=r"\['b'\]"):
        union_tensor_dict(
            left, TensorDict({"b": torch.zeros(2), "c": torch.zeros(2)}, batch_size=[2])
        )
    assert "c" not in left


def test_union_numpy_dict_treats_nan_as_equal() -> None:
    left = {"a": np.array([np.nan, 1.0])}
    union_numpy_dict(left, {"a": np.array([np.nan, 1.0]), "b": np.array(["x", "y"])})
    assert set(left) == {"a", "b"}
    with pytest.raises(ValueError, match=r"\['a'\]"):
        union_numpy_dict(left, {"a": np.array([0.0, 1.0])})


def test_union_numpy_dict_compares_self_referencing_object_arrays() -> None:
    def cycle() -> np.ndarray:
        array = np.empty(2, dtype=object)
        array[0], array[1] = array, "x"
        return array

    left, right = cycle(), cycle()
    merged = union_numpy_dict({"data": left}, {"data": right})
    assert merged["data"] is left
    nested = [1]
    nested.append(nested)  # type: ignore[arg-type]
    other = [1]
    other.append(other)  # type: ignore[arg-type]
    lists = union_numpy_dict(
        {"n": np.array([nested, 0], dtype=object)}, {"n": np.array([other, 0], dtype=object)}
    )
    assert lists["n"][0] is nested
    not_a_cycle = np.array([None, "x"], dtype=object)
    with pytest.raises(ValueError, match=r"key\(s\) \['data'\]"):
        union_numpy_dict({"data": left}, {"data": not_a_cycle})
