"""Assertions for tests that handle DataProtos (ours and downstream packages')."""

from __future__ import annotations

import torch

from hf_protocol.columns import tensor_columns, values_equal
from hf_protocol.data_proto import DataProto


def assert_dataproto_equal(actual: DataProto, expected: DataProto, check_meta: bool = True) -> None:
    """Raise ``AssertionError`` naming the first difference between two DataProtos.

    Tensors must match in dtype, shape and values (NaN equal to NaN); numpy columns
    element by element; meta_info by value when ``check_meta``.
    """
    assert len(actual) == len(expected), f"lengths differ: {len(actual)} != {len(expected)}"
    assert (actual.batch is None) == (expected.batch is None), "one side has no tensor batch"
    if actual.batch is not None and expected.batch is not None:
        got, want = tensor_columns(actual.batch), tensor_columns(expected.batch)
        assert got.keys() == want.keys(), f"batch keys differ: {sorted(got)} != {sorted(want)}"
        for key, tensor in want.items():
            other = got[key]
            assert other.dtype == tensor.dtype, (
                f"batch[{key!r}] dtype {other.dtype} != {tensor.dtype}"
            )
            assert other.shape == tensor.shape, (
                f"batch[{key!r}] shape {other.shape} != {tensor.shape}"
            )
            same = torch.equal(other, tensor) or (
                other.is_floating_point()
                and bool(torch.allclose(other, tensor, 0, 0, equal_nan=True))
            )
            assert same, f"batch[{key!r}] values differ"
    got_nt, want_nt = actual.non_tensor_batch, expected.non_tensor_batch
    assert got_nt.keys() == want_nt.keys(), (
        f"non_tensor_batch keys differ: {sorted(got_nt)} != {sorted(want_nt)}"
    )
    for key, array in want_nt.items():
        other_array = got_nt[key]
        assert other_array.dtype == array.dtype, (
            f"non_tensor_batch[{key!r}] dtype {other_array.dtype} != {array.dtype}"
        )
        assert values_equal(other_array, array), f"non_tensor_batch[{key!r}] differs"
    if check_meta:
        assert values_equal(actual.meta_info, expected.meta_info), (
            f"meta_info differs: {actual.meta_info!r:.200} != {expected.meta_info!r:.200}"
        )
