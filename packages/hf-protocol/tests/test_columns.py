import numpy as np
import pytest
import torch

from hf_protocol.columns import (
    as_row_indices,
    check_tensor_column,
    dtype_from_name,
    to_numpy_column,
    values_equal,
)


def test_numeric_list_becomes_numeric_array() -> None:
    column = to_numpy_column("x", [1, 2, 3])
    assert column.dtype.kind == "i" and column.tolist() == [1, 2, 3]


def test_strings_and_ragged_lists_become_one_object_per_sample() -> None:
    strings = to_numpy_column("s", ["a", "bc"])
    assert strings.dtype == object and strings.shape == (2,)
    ragged = to_numpy_column("r", [[1, 2], [3, 4]])  # rectangular, still one list per sample
    assert ragged.dtype == object and ragged.shape == (2,) and ragged[1] == [3, 4]


@pytest.mark.parametrize("value", [5, {"a": 1}, "text", np.float32(1.0)])
def test_values_that_are_not_columns_are_rejected_with_the_key(value: object) -> None:
    with pytest.raises(TypeError, match=r"non_tensor_batch\['bad'\].*meta_info"):
        to_numpy_column("bad", value)


def test_tensor_in_non_tensor_column_points_to_batch() -> None:
    with pytest.raises(TypeError, match="put tensors in `batch`"):
        to_numpy_column("t", torch.zeros(3))


def test_zero_dim_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="0-d array"):
        to_numpy_column("z", np.array(3))
    with pytest.raises(ValueError, match="0-d tensor"):
        check_tensor_column("z", torch.tensor(3))
    with pytest.raises(TypeError, match=r"must be a torch\.Tensor"):
        check_tensor_column("z", [1, 2])


def test_values_equal_handles_nan_objects_and_nesting() -> None:
    assert values_equal(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))
    assert values_equal(float("nan"), float("nan"))
    a = to_numpy_column("a", [{"k": [1, 2]}, None])
    b = to_numpy_column("b", [{"k": [1, 2]}, None])
    assert values_equal(a, b)
    assert not values_equal(a, to_numpy_column("c", [{"k": [1, 3]}, None]))
    assert not values_equal(torch.tensor([1]), torch.tensor([1.0]))
    assert not values_equal([1], (1,))
    assert not values_equal(np.zeros(2), np.zeros(3))


def test_row_indices_from_masks_lists_and_negative_ints() -> None:
    assert as_row_indices([True, False, True], 3).tolist() == [0, 2]
    assert as_row_indices(torch.tensor([-1, 0]), 3).tolist() == [2, 0]
    assert as_row_indices([], 3).tolist() == []
    with pytest.raises(IndexError, match=r"\[3\]"):
        as_row_indices([3], 3)
    with pytest.raises(ValueError, match="bool mask has 2 entries"):
        as_row_indices([True, False], 3)
    with pytest.raises(TypeError, match="float"):
        as_row_indices([0.5], 3)


def test_dtype_from_name_rejects_non_dtypes() -> None:
    assert dtype_from_name("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="'load' is not a torch dtype"):
        dtype_from_name("load")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
def test_cat_rows_matches_torch_cat_above_and_below_the_huge_page_threshold(
    dtype: torch.dtype,
) -> None:
    from hf_protocol.columns import cat_rows

    for rows in (3, 40_000):  # 40_000 x 64 x 4 bytes is above 4 MiB for float32
        parts = [
            (torch.randn(rows, 64) > 0).to(dtype),
            (torch.randn(rows // 2 + 1, 64) > 0).to(dtype),
        ]
        joined = cat_rows(parts)
        assert joined.dtype == dtype and torch.equal(joined, torch.cat(parts))
    grad = torch.ones(2, 3, requires_grad=True)
    assert cat_rows([grad, grad]).requires_grad
