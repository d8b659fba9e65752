"""verl's ``verl.protocol`` names over hf-protocol, for porting verl worker code by its imports.

``from verl.protocol import DataProto`` becomes ``from hf_protocol.compat.verl import
DataProto``. The :class:`DataProto` here is hf-protocol's, with what verl code calls that
hf-protocol does not have natively:

* ``from_dict(..., auto_padding=True)`` / ``from_single_dict(..., auto_padding=True)``,
  :class:`DataProtoConfig` ``.auto_padding`` and ``is_padding_enabled()``: kept for
  verl code, though hf-protocol never needs padding to split (``chunk`` gives balanced
  parts of any size), so the flag changes nothing;
* ``padding(n, padding_candidate)``: appends ``n`` copies of the first or last row in place;
* ``unfold_column_chunks``, ``print_size``, ``get_data_info``;
* errors where verl's code asserts: what hf-protocol raises as ``ValueError`` (``TypeError``)
  is raised here as :class:`VerlCompatError` (:class:`VerlCompatTypeError`), which is also
  an ``AssertionError``, so both ``except ValueError`` and verl's
  ``pytest.raises(AssertionError)`` catch it.

Deliberate differences from verl (docs/from-verl.md): ``chunk(n)`` accepts any length
(balanced parts instead of an assertion), pickling never goes through ``torch.save``,
and ``save_to_disk`` writes hf-protocol's safe archive, not a pickle.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar, cast

import numpy as np
import torch
from tensordict import TensorDict

import hf_protocol
from hf_protocol import (
    DataProtoFuture,
    DataProtoItem,
    all_gather_data_proto,
    fields,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)
from hf_protocol import union_numpy_dict as _union_numpy_dict
from hf_protocol import union_tensor_dict as _union_tensor_dict
from hf_protocol.columns import tensor_columns, values_equal
from hf_protocol.compat.verl_serialization import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)

_P = ParamSpec("_P")
_R = TypeVar("_R")

AUTO_PADDING_ENV = "VERL_AUTO_PADDING"


class VerlCompatError(ValueError, AssertionError):
    """A ``ValueError`` of hf-protocol, also an ``AssertionError`` as verl's asserts raise."""


class VerlCompatTypeError(TypeError, AssertionError):
    """A ``TypeError`` of hf-protocol, also an ``AssertionError`` as verl's asserts raise."""


def _verl_errors(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """Re-raise the ``ValueError``/``TypeError`` of ``function`` as :class:`VerlCompatError`
    / :class:`VerlCompatTypeError`, so verl code expecting ``AssertionError`` catches them."""

    @functools.wraps(function)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return function(*args, **kwargs)
        except AssertionError:
            raise
        except ValueError as error:
            raise VerlCompatError(str(error)) from error
        except TypeError as error:
            raise VerlCompatTypeError(str(error)) from error

    return wrapper


class _DataProtoConfigMeta(type):
    """Makes ``DataProtoConfig.auto_padding`` a class-level property, as verl's is."""

    _auto_padding = False
    auto_padding_key = "_verl_auto_padding"

    @property
    def auto_padding(cls) -> bool:
        """True when set on the class or when ``VERL_AUTO_PADDING`` is ``1``/``true``."""
        from_env = os.environ.get(AUTO_PADDING_ENV, "false").lower() in ("1", "true")
        return from_env or cls._auto_padding

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise VerlCompatTypeError(f"auto_padding must be a bool, got {enabled!r}")
        cls._auto_padding = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """verl's process-wide DataProto switches. ``auto_padding`` is accepted and reported
    (``DataProto.is_padding_enabled``) but not needed: ``chunk`` splits any length."""


class DataProto(hf_protocol.DataProto):
    """hf-protocol's DataProto with verl's extra names (see the module docstring)."""

    @classmethod
    @_verl_errors
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """hf-protocol's ``from_dict``; ``auto_padding=True`` marks the batch padding-enabled."""
        meta = dict(meta_info or {})
        if auto_padding:
            meta[DataProtoConfig.auto_padding_key] = True
        return cast(DataProto, super().from_dict(tensors, non_tensors, meta, num_batch_dims))

    @classmethod
    def from_single_dict(
        cls,
        data: dict[str, Any],
        meta_info: dict[str, Any] | None = None,
        auto_padding: bool = False,
    ) -> DataProto:
        """Tensors of ``data`` to ``batch``, the rest to ``non_tensor_batch``."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        others = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors, others, meta_info, auto_padding=auto_padding)

    def is_padding_enabled(self) -> bool:
        """True when this batch was built with ``auto_padding=True`` or
        ``DataProtoConfig.auto_padding`` is on."""
        own = bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False))
        return own or DataProtoConfig.auto_padding

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first row (``padding_candidate="first"``)
        or of the last row (anything else) in place."""
        if padding_size == 0:
            return
        if padding_size < 0 or len(self) == 0:
            raise VerlCompatError(
                f"padding: padding_size must be >= 0 and the batch non-empty, got "
                f"padding_size={padding_size} for {len(self)} rows"
            )
        row = 0 if padding_candidate == "first" else len(self) - 1
        order = np.concatenate([np.arange(len(self)), np.full(padding_size, row)])
        padded = self.select_idxs(order)
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    @staticmethod
    def concat(data: Sequence[hf_protocol.DataProto]) -> hf_protocol.DataProto:
        """hf-protocol's ``concat``; a meta_info key that differs between parts raises
        :class:`VerlCompatError` naming it."""
        seen: dict[str, Any] = {}
        for part in data:
            for key, value in part.meta_info.items():
                if key == fields.METRICS:
                    continue
                if key in seen and not values_equal(seen[key], value):
                    raise VerlCompatError(
                        f"Conflicting values for meta_info key {key!r}: {seen[key]!r:.80} and "
                        f"{value!r:.80}; concat needs every part to agree outside 'metrics'."
                    )
                seen.setdefault(key, value)
        return _verl_errors(hf_protocol.DataProto.concat)(data)

    @_verl_errors
    def union(self, other: hf_protocol.DataProto) -> DataProto:
        """hf-protocol's ``union``, raising :class:`VerlCompatError` on a conflict."""
        super().union(other)
        return self

    def unfold_column_chunks(
        self, n_split: int, split_keys: Sequence[str] | None = None
    ) -> DataProto:
        """Cut each ``split_keys`` column along dim 1 into ``n_split`` pieces laid out as
        rows (``[N, n_split * k, ...]`` -> ``[N * n_split, k, ...]``); every other column
        repeats each row ``n_split`` times so rows stay aligned. meta_info is kept."""
        keys = set(split_keys or [])

        def unfold(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return value.repeat_interleave(n_split, dim=0)
            return np.repeat(value, n_split, axis=0)

        def split(key: str, value: Any) -> Any:
            if isinstance(value, np.ndarray) and value.ndim == 1:
                value = _rows_as_matrix(key, value)
            if value.shape[1] % n_split:
                raise VerlCompatError(
                    f"unfold_column_chunks: {key!r} has {value.shape[1]} entries in dim 1, "
                    f"not divisible by n_split={n_split}"
                )
            rows = value.shape[0] * n_split
            return value.reshape(rows, value.shape[1] // n_split, *value.shape[2:])

        batch = None
        if self.batch is not None:
            columns = {
                k: split(k, v) if k in keys else unfold(v)
                for k, v in tensor_columns(self.batch).items()
            }
            batch = TensorDict(columns, batch_size=[len(self) * n_split], device=self.batch.device)
        non_tensor = {
            k: split(k, v) if k in keys else unfold(v) for k, v in self.non_tensor_batch.items()
        }
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    def print_size(self, prefix: str = "") -> None:
        """Print the GiB held by the tensor and the numpy columns."""
        tensor_bytes = self.nbytes - sum(a.nbytes for a in self.non_tensor_batch.values())
        array_bytes = self.nbytes - tensor_bytes
        message = (
            f"Size of tensordict: {tensor_bytes / 1024**3} GB, "
            f"size of non_tensor_batch: {array_bytes / 1024**3} GB"
        )
        print(f"{prefix}, {message}" if prefix else message)

    def get_data_info(self) -> str:
        """A multi-line description: each tensor column (shape, dtype, device), each
        non-tensor column (shape, dtype) and each meta_info entry's (nested) type."""
        lines = ["batch"]
        if self.batch is not None:
            for key, tensor in tensor_columns(self.batch).items():
                lines.append(f"  {key}: {tuple(tensor.shape)} ({tensor.dtype}) {tensor.device}")
        lines.append("non_tensor_batch")
        for key, array in self.non_tensor_batch.items():
            lines.append(f"  {key}: ndarray{array.shape} ({array.dtype})")
        lines.append("meta_info")
        lines += [f"  {key}: {_type_info(value)}" for key, value in self.meta_info.items()]
        return "\n".join(lines)

    @staticmethod
    def load_from_disk(filepath: str | os.PathLike[str], allow_pickle: bool = False) -> DataProto:
        """hf-protocol's ``load_from_disk``, returning this module's DataProto."""
        loaded = hf_protocol.DataProto.load_from_disk(filepath, allow_pickle=allow_pickle)
        return DataProto(loaded.batch, loaded.non_tensor_batch, loaded.meta_info)


def _type_info(value: Any) -> str:
    """``list[int]``, ``dict[str: float]``, ``tuple(int, str)``, ``ndarray(3,) (int64)``."""
    if isinstance(value, list):
        inner = sorted({_type_info(v) for v in value[:3]})
        return f"list[{'|'.join(inner) if inner else '...'}]"
    if isinstance(value, tuple):
        return f"tuple({', '.join(_type_info(v) for v in value)})"
    if isinstance(value, dict):
        if not value:
            return "dict"
        key, item = next(iter(value.items()))
        return f"dict[{_type_info(key)}: {_type_info(item)}]"
    if isinstance(value, np.ndarray):
        return f"ndarray{value.shape} ({value.dtype})"
    return type(value).__name__


def _rows_as_matrix(key: str, column: np.ndarray) -> np.ndarray:
    """A 1-D column of equal-length per-row sequences as a 2-D object array (verl builds
    such columns 2-D from the start; hf-protocol keeps one object per row)."""
    lengths = {len(row) if isinstance(row, (list, tuple, np.ndarray)) else -1 for row in column}
    if len(lengths) != 1 or -1 in lengths:
        raise VerlCompatError(
            f"unfold_column_chunks: {key!r} needs a second dimension to split: a 2-D array, "
            f"or one equal-length list per row"
        )
    matrix = np.empty((len(column), lengths.pop()), dtype=object)
    for index, row in enumerate(column):
        for position, item in enumerate(row):
            matrix[index, position] = item
    return matrix


def fold_batch_dim(data: hf_protocol.DataProto, new_batch_size: int) -> hf_protocol.DataProto:
    """``data.fold_batch_dim(new_batch_size)``: ``[N, ...]`` -> ``[new_batch_size, N //
    new_batch_size, ...]``."""
    return _verl_errors(data.fold_batch_dim)(new_batch_size)


def unfold_batch_dim(data: hf_protocol.DataProto, batch_dims: int = 2) -> hf_protocol.DataProto:
    """``data.unfold_batch_dim(batch_dims)``: merge the first ``batch_dims`` dimensions."""
    return _verl_errors(data.unfold_batch_dim)(batch_dims)


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """hf-protocol's ``union_tensor_dict``, raising :class:`VerlCompatError` on a conflict."""
    return _verl_errors(_union_tensor_dict)(tensor_dict1, tensor_dict2)


def union_numpy_dict(
    tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """hf-protocol's ``union_numpy_dict`` (NaN equals NaN, object arrays compared deeply,
    self-references allowed); a key holding different arrays raises
    :class:`VerlCompatError` naming the key."""
    for key, value in tensor_dict2.items():
        if key in tensor_dict1 and not values_equal(tensor_dict1[key], value):
            raise VerlCompatError(
                f"`{key}` in tensor_dict1 and tensor_dict2 are not the same object. "
                f"Rename one side or drop the stale column before the union."
            )
    return _union_numpy_dict(tensor_dict1, tensor_dict2)


def collate_fn(items: Sequence[DataProtoItem]) -> DataProto:
    """Stack single items (``data[i]``) back into a DataProto, for a torch DataLoader."""
    rows = [item.batch for item in items if item.batch is not None]
    batch = None
    if rows:
        if len(rows) != len(items):
            raise VerlCompatError("collate_fn: some items have a tensor batch and some do not")
        batch = cast(TensorDict, torch.stack(cast(list[torch.Tensor], rows)).contiguous())
    keys: list[str] = list(items[0].non_tensor_batch) if items else []
    non_tensor: dict[str, Any] = {}
    for key in keys:
        column = np.empty(len(items), dtype=object)
        for index, item in enumerate(items):
            column[index] = item.non_tensor_batch[key]
        non_tensor[key] = column
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


def list_of_dict_to_dict_of_list(list_of_dict: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """``[{"a": 1}, {"a": 2}]`` -> ``{"a": [1, 2]}`` (keys of the first dict)."""
    if not list_of_dict:
        return {}
    return {key: [entry[key] for entry in list_of_dict] for key in list_of_dict[0]}


__all__ = [
    "DataProto",
    "DataProtoConfig",
    "DataProtoFuture",
    "DataProtoItem",
    "VerlCompatError",
    "VerlCompatTypeError",
    "all_gather_data_proto",
    "collate_fn",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]
