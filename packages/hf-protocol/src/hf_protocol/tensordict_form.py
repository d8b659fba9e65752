"""A DataProto as one TensorDict, and back.

Libraries built on tensordict (and verl's newer workers) pass a single ``TensorDict``
around instead of the three parts of a DataProto. The mapping:

* each tensor column is a tensor entry, batch dimension 0;
* each non-tensor column is a ``NonTensorStack`` entry, one ``NonTensorData`` per
  sample (so strings, lists and dicts survive as they are);
* each meta_info entry is a ``NonTensorData`` entry (one value for the whole batch).

Reading back, a ``NonTensorStack`` becomes a non-tensor column and a ``NonTensorData``
a meta_info entry. A non-tensor column whose entries are all numbers comes back as a
numeric array; any other column as a 1-D object array (an object column of more than
one dimension comes back as one entry per row).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from hf_protocol.columns import tensor_columns, to_numpy_column

Parts = tuple[TensorDict | None, dict[str, np.ndarray], dict[str, Any]]


def parts_to_tensordict(
    batch: TensorDict | None,
    non_tensor_batch: dict[str, np.ndarray],
    meta_info: dict[str, Any],
    length: int,
) -> TensorDict:
    """One TensorDict with batch size ``[length]`` holding every part of a DataProto.

    Column and meta_info keys share one namespace there, so a key in two parts is an
    error rather than a silent overwrite.
    """
    columns: dict[str, Any] = dict(tensor_columns(batch)) if batch is not None else {}
    clashes = sorted(set(columns) & set(non_tensor_batch))
    clashes += sorted((set(columns) | set(non_tensor_batch)) & set(meta_info))
    if clashes:
        raise ValueError(
            f"to_tensordict: key(s) {clashes} appear in more than one of batch, "
            f"non_tensor_batch and meta_info; a TensorDict has one namespace. Rename them "
            f"first (DataProto.rename, or pop the meta_info entry)."
        )
    for key, column in non_tensor_batch.items():
        items: list[Any] = [NonTensorData(item) for item in column]
        columns[key] = NonTensorStack.from_list(items)
    has_rows = batch is not None or bool(non_tensor_batch)
    result = TensorDict(columns, batch_size=[length] if has_rows else [])
    for key, value in meta_info.items():
        result[key] = NonTensorData(value)
    return result


def parts_from_tensordict(
    tensor_dict: TensorDict, meta_info: dict[str, Any] | None = None, num_batch_dims: int = 1
) -> Parts:
    """``(batch, non_tensor_batch, meta_info)`` read from a TensorDict (see the module
    docstring); ``meta_info`` entries given here are added to those it holds."""
    if not isinstance(tensor_dict, TensorDict):
        raise TypeError(f"from_tensordict needs a TensorDict, got {type(tensor_dict).__name__}")
    if num_batch_dims != 1:
        raise ValueError(
            f"num_batch_dims={num_batch_dims} is not supported; DataProto has one batch dimension."
        )
    tensors: dict[str, torch.Tensor] = {}
    non_tensor: dict[str, np.ndarray] = {}
    meta = dict(meta_info or {})
    for key, value in tensor_dict.items():
        if isinstance(value, NonTensorStack):
            non_tensor[key] = to_numpy_column(key, value.tolist())
        elif isinstance(value, NonTensorData):
            meta[key] = value.data
        elif isinstance(value, torch.Tensor):
            tensors[key] = value
        else:
            raise TypeError(
                f"from_tensordict: entry {key!r} is a {type(value).__name__}; DataProto holds "
                f"flat tensor columns, NonTensorStack columns and NonTensorData meta_info."
            )
    batch = None
    if tensors:
        rows = {int(t.shape[0]) for t in tensors.values()}
        if len(rows) > 1:
            raise ValueError(f"from_tensordict: tensors have different batch sizes {rows}")
        batch = TensorDict(tensors, batch_size=[rows.pop()])
    return batch, non_tensor, meta
