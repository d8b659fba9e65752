"""verl's ``verl.utils.tensordict_utils`` names: a batch as one TensorDict.

verl's newer workers pass one ``TensorDict`` in which per-sample Python values (strings,
lists, dicts) are ``NonTensorStack`` entries and batch-level values ``NonTensorData``
entries, the layout of :meth:`hf_protocol.DataProto.to_tensordict`. These helpers build,
read, split and join such TensorDicts:

* :func:`get_tensordict` builds one from tensors and per-sample lists plus batch-level
  values; :func:`assign_non_tensor` adds values to one;
* :func:`get`, :func:`pop`, :func:`get_non_tensor_data` read an entry as plain Python
  (a tensor, a list, or the wrapped value);
* :func:`contiguous`, :func:`concat_tensordict`, :func:`chunk_tensordict` and
  :func:`concat_nested_tensors` handle jagged nested tensors, which
  ``TensorDict.cat``/``chunk`` do not.

``chunk_tensordict`` splits any length into balanced parts (sizes differing by at most
one) like ``DataProto.chunk``, where verl's asserts that the length divides evenly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from hf_protocol.compat.verl import VerlCompatError
from hf_protocol.sizes import balanced_chunk_sizes, offsets


def _stack(values: Iterable[Any]) -> NonTensorStack:
    """One ``NonTensorData`` per sample, so nested lists and dicts are kept whole."""
    items: list[Any] = [NonTensorData(value) for value in values]
    return NonTensorStack.from_list(items)


def _rows(key: str, value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.size(0))
    return len(value)


def get_tensordict(
    tensor_dict: dict[str, Any], non_tensor_dict: dict[str, Any] | None = None
) -> TensorDict:
    """A TensorDict from per-sample columns and batch-level values.

    ``tensor_dict`` maps keys to tensors (jagged nested tensors allowed), lists or numpy
    arrays (stored as ``NonTensorStack``, one entry per sample) or ready
    ``NonTensorStack`` entries; all must have the same number of rows. ``non_tensor_dict``
    values are stored as ``NonTensorData``. The batch size is ``[rows]``, or ``[]`` when
    there are no columns.
    """
    non_tensor_dict = dict(non_tensor_dict or {})
    columns: dict[str, Any] = {}
    rows: dict[str, int] = {}
    for key, value in tensor_dict.items():
        jagged = isinstance(value, torch.Tensor) and value.layout == torch.jagged
        if isinstance(value, torch.Tensor) and value.is_nested and not jagged:
            raise VerlCompatError(
                f"get_tensordict: nested tensor {key!r} must be contiguous with "
                f"layout=torch.jagged, got layout={value.layout}"
            )
        if isinstance(value, (list, np.ndarray)):
            if any(isinstance(item, torch.Tensor) for item in value):
                raise VerlCompatError(
                    f"get_tensordict: list {key!r} holds tensors; a list becomes a "
                    f"NonTensorStack, which cannot hold tensors. Stack them into one tensor "
                    f"or convert them to numpy first."
                )
            columns[key] = _stack(value)
        elif isinstance(value, (torch.Tensor, NonTensorStack)):
            columns[key] = value
        else:
            raise VerlCompatError(
                f"get_tensordict: {key!r} is a {type(value).__name__}; columns must be "
                f"tensors, lists or numpy arrays (batch-level values go in non_tensor_dict)"
            )
        rows[key] = _rows(key, value)
    if len(set(rows.values())) > 1:
        raise VerlCompatError(f"get_tensordict: columns have different batch sizes {rows}")
    clashes = sorted(set(non_tensor_dict) & set(columns))
    if clashes:
        raise VerlCompatError(f"get_tensordict: key(s) {clashes} are both a column and a value")
    batch_size = [next(iter(rows.values()))] if rows else []
    result = TensorDict(columns, batch_size=batch_size)
    for key, value in non_tensor_dict.items():
        result[key] = NonTensorData(value)
    return result


def assign_non_tensor_data(tensor_dict: TensorDict, key: str, val: Any) -> None:
    """Store one batch-level value under ``key`` (as ``NonTensorData``)."""
    _require_tensordict(tensor_dict)
    tensor_dict[key] = NonTensorData(val)


def assign_non_tensor_stack(tensor_dict: TensorDict, key: str, val: Sequence[Any]) -> None:
    """Store a per-sample list under ``key`` (as a ``NonTensorStack``)."""
    _require_tensordict(tensor_dict)
    tensor_dict[key] = _stack(val)


def assign_non_tensor(tensor_dict: TensorDict, **kwargs: Any) -> TensorDict:
    """Store each keyword: lists per sample, anything else as one batch-level value."""
    _require_tensordict(tensor_dict)
    for key, value in kwargs.items():
        if isinstance(value, (NonTensorData, NonTensorStack)):
            tensor_dict[key] = value
        elif isinstance(value, list):
            assign_non_tensor_stack(tensor_dict, key, value)
        else:
            assign_non_tensor_data(tensor_dict, key, value)
    return tensor_dict


def unwrap_non_tensor_data(data: Any) -> Any:
    """The value inside a ``NonTensorData``; anything else unchanged."""
    return data.data if isinstance(data, NonTensorData) else data


def get_non_tensor_data(data: TensorDict, key: str, default: Any) -> Any:
    """``data[key]`` unwrapped from ``NonTensorData``, or ``default`` when absent."""
    return unwrap_non_tensor_data(data.get(key, default))


def _plain(value: Any) -> Any:
    if isinstance(value, NonTensorStack):
        return value.tolist()
    if isinstance(value, NonTensorData):
        return value.data
    return value


def get(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """An entry as plain Python: a tensor, a list (per-sample values) or the wrapped
    value; ``default`` when absent."""
    if key not in tensordict:
        return default
    return _plain(tensordict.get(key))


def pop(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """Like :func:`get`, and removes the entry."""
    if key not in tensordict:
        return default
    return _plain(tensordict.pop(key))


def _take_keys(tensordict: TensorDict, keys: Iterable[str], remove: bool) -> TensorDict:
    """A new TensorDict of ``keys`` (columns stay columns, batch-level values stay values)."""
    keys = list(keys)
    missing = [key for key in keys if key not in tensordict]
    if missing:
        raise KeyError(
            f"key(s) {missing} not in the TensorDict; it has {sorted(tensordict.keys())}"
        )
    columns: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for key in keys:
        entry = tensordict.pop(key) if remove else tensordict.get(key)
        if isinstance(entry, NonTensorData):
            values[key] = entry.data
        else:
            columns[key] = entry
    return get_tensordict(columns, values)


def get_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """A new TensorDict holding only ``keys`` (KeyError naming any that is missing)."""
    return _take_keys(tensordict, keys, remove=False)


def pop_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """Like :func:`get_keys`, and removes those keys from ``tensordict``."""
    return _take_keys(tensordict, keys, remove=True)


def index_select_tensor_dict(
    batch: TensorDict, indices: torch.Tensor | Sequence[int]
) -> TensorDict:
    """Rows ``indices`` (any order, repeats allowed) of every column, nested tensors and
    per-sample lists included; batch-level values are kept."""
    rows = torch.as_tensor(indices, dtype=torch.long)
    if rows.dim() != 1:
        raise VerlCompatError(f"indices must be 1-D, got shape {tuple(rows.shape)}")
    columns: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for key, entry in batch.items():
        if isinstance(entry, NonTensorData):
            values[key] = entry.data
        elif isinstance(entry, NonTensorStack):
            items = entry.tolist()
            columns[key] = _stack(items[i] for i in rows.tolist())
        elif not isinstance(entry, torch.Tensor):
            raise VerlCompatError(f"index_select_tensor_dict: {key!r} is a {type(entry).__name__}")
        elif entry.is_nested:
            components = entry.unbind(0)
            picked = [components[i] for i in rows.tolist()]
            columns[key] = nested_tensor_from_tensor_list(picked, _ragged_idx(entry))
        else:
            columns[key] = entry[rows]
    if not columns:
        raise VerlCompatError("index_select_tensor_dict: the TensorDict has no per-row columns")
    return get_tensordict(columns, values)


def pad_to_divisor(data: TensorDict, size_divisor: int) -> tuple[TensorDict, int]:
    """Append rows (copies of the first rows, cycling) until the length divides
    ``size_divisor``; returns ``(padded, pad_size)``, undone by :func:`unpad`."""
    length = len(data)
    pad_size = -length % size_divisor
    if pad_size == 0:
        return data, 0
    if length == 0:
        raise VerlCompatError("pad_to_divisor: an empty TensorDict has no rows to repeat")
    order = torch.arange(length + pad_size) % length
    return index_select_tensor_dict(data, order), pad_size


def unpad(data: TensorDict, pad_size: int) -> TensorDict:
    """Drop the last ``pad_size`` rows added by :func:`pad_to_divisor`."""
    return data[: len(data) - pad_size] if pad_size else data


def contiguous(data: TensorDict) -> TensorDict:
    """A new TensorDict with every tensor contiguous; non-tensor entries kept as they are
    (``TensorDict.contiguous`` would turn ``NonTensorData`` into stacks)."""
    columns: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise VerlCompatError(f"contiguous: nested key {key!r} is not supported")
        if isinstance(value, NonTensorData):
            values[key] = value.data
        elif isinstance(value, NonTensorStack):
            columns[key] = value
        elif isinstance(value, torch.Tensor):
            columns[key] = value.contiguous()
        else:
            raise VerlCompatError(f"contiguous: {key!r} is a {type(value).__name__}")
    return get_tensordict(columns, values)


def nested_tensor_from_tensor_list(
    tensors: Sequence[torch.Tensor], ragged_idx: int | None = None
) -> torch.Tensor:
    """A jagged nested tensor with one component per tensor, ragged in dimension
    ``ragged_idx`` of the result (default: the components' last dimension).

    The ragged dimension is stated rather than inferred, so a part whose rows happen to
    have equal lengths keeps the same layout as the rest of its batch.
    """
    if not tensors:
        raise VerlCompatError("nested_tensor_from_tensor_list needs at least one tensor")
    sample_dims = tensors[0].dim()
    ragged = sample_dims if ragged_idx is None else ragged_idx
    if not 1 <= ragged <= sample_dims:
        raise VerlCompatError(
            f"nested_tensor_from_tensor_list: ragged_idx must be in [1, {sample_dims}] for "
            f"{sample_dims}-d components, got {ragged}"
        )
    values = torch.cat(list(tensors), dim=ragged - 1)
    lengths = torch.tensor([t.shape[ragged - 1] for t in tensors], device=values.device)
    offsets = torch.zeros(len(tensors) + 1, dtype=torch.long, device=values.device)
    torch.cumsum(lengths, dim=0, out=offsets[1:])
    return torch.nested.nested_tensor_from_jagged(values, offsets, jagged_dim=ragged)


def _ragged_idx(tensor: torch.Tensor) -> int:
    return int(getattr(tensor, "_ragged_idx", tensor.dim() - 1))


def concat_nested_tensors(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Join jagged nested tensors (each ``[B_i, ...]`` with the same ragged dimension)
    along dim 0."""
    components: list[torch.Tensor] = []
    for tensor in tensors:
        if not (tensor.is_nested and tensor.is_contiguous() and tensor.dim() >= 2):
            raise VerlCompatError(
                f"concat_nested_tensors: every tensor must be a contiguous nested tensor of "
                f">= 2 dims, got shape {tuple(tensor.shape)} (nested={tensor.is_nested})"
            )
        components.extend(tensor.unbind(0))
    return nested_tensor_from_tensor_list(components, _ragged_idx(tensors[0]))


def _nested_keys(td: TensorDict) -> set[str]:
    return {k for k, v in td.items() if isinstance(v, torch.Tensor) and v.is_nested}


def concat_tensordict(data: Sequence[TensorDict]) -> TensorDict:
    """Join TensorDicts along the batch dimension, nested tensors included. TensorDicts
    without a batch dimension (batch-level values only) yield the first one."""
    if not data:
        raise VerlCompatError("concat_tensordict needs at least one TensorDict")
    if all(len(td.batch_size) == 0 for td in data):
        return data[0]
    nested = _nested_keys(data[0])
    for index, td in enumerate(data):
        if _nested_keys(td) != nested:
            raise VerlCompatError(
                f"concat_tensordict: part {index} has nested tensors {sorted(_nested_keys(td))}"
                f", part 0 {sorted(nested)}"
            )
    regular = [
        TensorDict(
            {k: v for k, v in td.items() if k not in nested},
            batch_size=td.batch_size,
            device=td.device,
        )
        for td in data
    ]
    output = TensorDict.cat(regular, dim=0)
    for key in nested:
        output[key] = concat_nested_tensors([td[key] for td in data])
    return output


def chunk_tensordict(td: TensorDict, chunks: int) -> list[TensorDict]:
    """Split into ``chunks`` consecutive parts of balanced sizes (10 rows in 4 -> 3/3/2/2),
    nested tensors included."""
    if not isinstance(td, TensorDict):
        raise VerlCompatError(f"chunk_tensordict needs a TensorDict, got {type(td).__name__}")
    bounds = offsets(balanced_chunk_sizes(len(td), chunks))
    nested = _nested_keys(td)
    regular = TensorDict(
        {k: v for k, v in td.items() if k not in nested}, batch_size=td.batch_size, device=td.device
    )
    parts = [regular[start:stop] for start, stop in bounds]
    if nested and len(td) < chunks:
        raise VerlCompatError(
            f"chunk_tensordict: {len(td)} rows cannot fill {chunks} parts when nested "
            f"tensors {sorted(nested)} are present (a nested tensor has no empty form)"
        )
    for key in nested:
        rows = td[key].unbind(0)
        for part, (start, stop) in zip(parts, bounds, strict=True):
            part[key] = nested_tensor_from_tensor_list(rows[start:stop], _ragged_idx(td[key]))
    return parts


def _require_tensordict(value: Any) -> None:
    if not isinstance(value, TensorDict):
        raise VerlCompatError(f"expected a TensorDict, got {type(value).__name__}")


__all__ = [
    "assign_non_tensor",
    "assign_non_tensor_data",
    "assign_non_tensor_stack",
    "chunk_tensordict",
    "concat_nested_tensors",
    "concat_tensordict",
    "contiguous",
    "get",
    "get_keys",
    "get_non_tensor_data",
    "get_tensordict",
    "index_select_tensor_dict",
    "nested_tensor_from_tensor_list",
    "pad_to_divisor",
    "pop",
    "pop_keys",
    "unpad",
    "unwrap_non_tensor_data",
]
