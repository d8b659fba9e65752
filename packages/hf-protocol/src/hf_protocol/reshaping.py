"""Folding samples into groups and back: ``[N, ...]`` <-> ``[G, N // G, ...]``.

Used to treat the ``n`` responses of one prompt as one row (e.g. for group-wise
advantages) and then return to one row per response.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tensordict import TensorDict

from hf_protocol.columns import tensor_columns

if TYPE_CHECKING:
    from hf_protocol.data_proto import DataProto


def _reshape(data: DataProto, rows: int, shape_of: Callable[[tuple[int, ...]], list[int]]) -> Any:
    batch = None
    if data.batch is not None:
        columns = {k: v.reshape(shape_of(v.shape)) for k, v in tensor_columns(data.batch).items()}
        batch = TensorDict(columns, batch_size=[rows])
    non_tensor = {k: v.reshape(shape_of(v.shape)) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Group consecutive rows: every column ``[N, ...]`` becomes ``[new_batch_size, N // new_batch_size, ...]``."""  # noqa: E501
    length = len(data)
    if isinstance(new_batch_size, bool) or new_batch_size < 1 or length % new_batch_size:
        raise ValueError(
            f"fold_batch_dim: new_batch_size={new_batch_size} must be positive and divide the "
            f"length {length}"
        )
    group = length // new_batch_size
    return _reshape(data, new_batch_size, lambda shape: [new_batch_size, group, *shape[1:]])


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Merge the first ``batch_dims`` dimensions of every column into one (undoes a fold)."""
    if isinstance(batch_dims, bool) or batch_dims < 1:
        raise ValueError(f"unfold_batch_dim: batch_dims must be >= 1, got {batch_dims}")
    shapes = [v.shape for v in data.non_tensor_batch.values()]
    if data.batch is not None:
        shapes += [v.shape for v in tensor_columns(data.batch).values()]
    leading = {tuple(shape[:batch_dims]) for shape in shapes}
    if len(leading) > 1:
        raise ValueError(
            f"unfold_batch_dim: columns disagree on their first {batch_dims} dimensions "
            f"{sorted(leading)}"
        )
    rows = math.prod(leading.pop()) if leading else len(data)
    return _reshape(data, rows, lambda shape: [rows, *shape[batch_dims:]])
