"""Per-sample columns: validation and conversion of tensors and numpy arrays.

A DataProto holds two kinds of columns, both indexed by sample along axis 0:
tensors in a TensorDict and everything else in numpy arrays (object arrays for
strings, lists and dicts). These helpers turn user input into such columns and
compare them, with errors that name the offending key.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

_SCALAR_TYPES = (bool, int, float, complex, np.bool_, np.number)


def to_numpy_column(key: str, value: Any) -> np.ndarray:
    """Return ``value`` as a numpy array with one entry per sample along axis 0.

    numpy arrays pass through unchanged. Lists and tuples become numeric arrays when
    every entry is a number, and 1-D object arrays otherwise (so a list of strings
    or of per-sample lists keeps one Python object per sample, as verl users expect).
    Anything else (a bare number, a dict, a tensor) cannot be a per-sample column.
    """
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            raise ValueError(
                f"non_tensor_batch[{key!r}] is a 0-d array ({value!r}); a column needs one "
                f"entry per sample. Put single values in meta_info instead."
            )
        return value
    if isinstance(value, torch.Tensor):
        raise TypeError(
            f"non_tensor_batch[{key!r}] is a torch.Tensor; put tensors in `batch` "
            f"(DataProto.from_dict(tensors=...)) or convert with .numpy()."
        )
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, _SCALAR_TYPES) for v in value):
            return np.asarray(value)
        column = np.empty(len(value), dtype=object)
        for i, item in enumerate(value):
            column[i] = item
        return column
    raise TypeError(
        f"non_tensor_batch[{key!r}] must be a numpy array, list or tuple with one entry per "
        f"sample, got {type(value).__name__} {value!r:.80}. Put single values in meta_info, "
        f"or wrap per-sample objects in a list."
    )


def check_tensor_column(key: str, value: Any) -> torch.Tensor:
    """Ensure ``value`` is a tensor with a batch dimension."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"batch[{key!r}] must be a torch.Tensor, got {type(value).__name__}; put "
            f"non-tensor columns in non_tensor_batch (numpy arrays or lists)."
        )
    if value.dim() == 0:
        raise ValueError(
            f"batch[{key!r}] is a 0-d tensor; a column needs a batch dimension. Put single "
            f"values in meta_info instead."
        )
    return value


def values_equal(a: Any, b: Any) -> bool:
    """Deep equality for column entries and meta_info values.

    Handles tensors, numpy arrays (object arrays element by element), nested lists,
    tuples and dicts, and treats NaN as equal to NaN so a column never conflicts
    with itself. Self-referencing containers (an object array holding itself)
    compare without endless recursion: a pair already being compared further up
    counts as equal, so two cycles of the same shape are equal.
    """
    return _values_equal(a, b, set())


def _values_equal(a: Any, b: Any, active: set[tuple[int, int]]) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.shape != b.shape:
            return False
        if a.dtype == object or b.dtype == object:
            return _items_equal(a, b, zip(a.ravel(), b.ravel(), strict=True), active)
        if np.issubdtype(a.dtype, np.inexact) or np.issubdtype(b.dtype, np.inexact):
            return bool(np.array_equal(a, b, equal_nan=True))
        return bool(np.array_equal(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if a.keys() != b.keys():
            return False
        return _items_equal(a, b, ((a[k], b[k]) for k in a), active)
    if isinstance(a, Sequence) and isinstance(b, Sequence) and not isinstance(a, (str, bytes)):
        if isinstance(b, (str, bytes)) or type(a) is not type(b) or len(a) != len(b):
            return False
        return _items_equal(a, b, zip(a, b, strict=True), active)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def _items_equal(
    a: Any, b: Any, pairs: Iterator[tuple[Any, Any]], active: set[tuple[int, int]]
) -> bool:
    """Containers ``a`` and ``b`` are equal when all their item ``pairs`` are; a pair met
    again while it is still being compared (a cycle) counts as equal."""
    key = (id(a), id(b))
    if key in active:
        return True
    active.add(key)
    try:
        return all(_values_equal(x, y, active) for x, y in pairs)
    finally:
        active.discard(key)


def describe_tensor(tensor: torch.Tensor) -> str:
    """``int64[8, 16] cpu``: a tensor's dtype, shape and device, for reprs and errors."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    return f"{dtype}{list(tensor.shape)} {tensor.device}"


def describe_array(array: np.ndarray) -> str:
    """``object[8]``: an array's dtype and shape, for reprs and errors."""
    return f"{array.dtype}{list(array.shape)}"


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; rejects names that are not torch dtypes."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


def tensor_columns(batch: TensorDict) -> dict[str, torch.Tensor]:
    """The ``key -> tensor`` columns of a DataProto batch.

    DataProto batches are flat: a nested TensorDict column is rejected here, so
    every other function can rely on plain tensors.
    """
    columns: dict[str, torch.Tensor] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor) or not isinstance(key, str):
            raise TypeError(
                f"batch[{key!r}] is a {type(value).__name__}; DataProto batches hold flat "
                f"tensor columns only (nested TensorDicts are not supported)."
            )
        columns[key] = value
    return columns


def as_row_indices(idxs: Any, length: int) -> np.ndarray:
    """Normalise an index list/array/tensor or a bool mask of ``length`` rows to int64 rows."""
    array = idxs.detach().cpu().numpy() if isinstance(idxs, torch.Tensor) else np.asarray(idxs)
    if array.ndim != 1:
        raise ValueError(f"index array must be 1-D, got shape {array.shape}")
    if array.dtype == np.bool_:
        if array.shape[0] != length:
            raise ValueError(f"bool mask has {array.shape[0]} entries but the batch has {length}")
        return np.flatnonzero(array)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"index array must hold integers or bools, got dtype {array.dtype}")
    bad = array[(array < -length) | (array >= length)]
    if bad.size:
        raise IndexError(f"indices {bad[:5].tolist()} are out of range for length {length}")
    return np.where(array < 0, array + length, array).astype(np.int64)


_HUGE_PAGE_THRESHOLD = 1 << 22  # numpy asks the kernel for huge pages from about 4 MiB on


def cat_rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(tensors)`` along dim 0, faster for large CPU results.

    A large output is allocated through numpy, which requests transparent huge
    pages, so writing it takes far fewer page faults than torch's own allocation
    (2x faster at 64-256 MiB on our CI machines; see docs/benchmarks.md).
    """
    first = tensors[0]
    uniform = all(
        t.dtype == first.dtype and t.device.type == "cpu" and t.shape[1:] == first.shape[1:]
        for t in tensors
    )
    rows = sum(t.shape[0] for t in tensors)
    nbytes = rows * first[:1].numel() * first.element_size()
    if not uniform or nbytes < _HUGE_PAGE_THRESHOLD or any(t.requires_grad for t in tensors):
        return torch.cat(tensors)
    buffer = torch.from_numpy(np.empty(nbytes, dtype=np.uint8))
    out = buffer.view(first.dtype).reshape(rows, *first.shape[1:])
    return torch.cat(tensors, out=out)
