"""DataProto: the batch every HybridFlow worker group takes in and hands back.

A DataProto is three things about the same ``N`` samples:

* ``batch`` — a ``TensorDict`` of tensors, batch dimension 0 (``[N, ...]``);
* ``non_tensor_batch`` — a dict of numpy arrays, one entry per sample along axis 0
  (object arrays for strings, lists and dicts);
* ``meta_info`` — a dict of values that describe the whole batch (temperature,
  metrics, global step).

The method names are verl's, so code written against ``verl.DataProto`` reads the
same. Where behaviour differs it is on purpose: ``chunk(n)`` always returns ``n``
balanced parts, pickling never goes through ``torch.save``, files load without
unpickling, and bad input raises an error that names the key and leaves the
inputs unchanged.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from hf_protocol import storage, tensordict_form, transport
from hf_protocol.columns import (
    as_row_indices,
    cat_rows,
    check_tensor_column,
    describe_array,
    describe_tensor,
    tensor_columns,
    to_numpy_column,
)
from hf_protocol.sizes import balanced_chunk_sizes, fixed_split_sizes, offsets
from hf_protocol.unions import (
    merge_concat_meta_info,
    union_meta_info,
    union_numpy_dict,
    union_tensor_dict,
)

IndexLike = Sequence[int] | Sequence[bool] | np.ndarray | torch.Tensor


@dataclass
class DataProtoItem:
    """One sample of a DataProto: ``data[i]``.

    ``batch`` is the TensorDict row (no batch dimension), ``non_tensor_batch`` maps
    each key to that sample's entry, and ``meta_info`` is the batch's meta_info.
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False, repr=False)
class DataProto:
    """A batch of samples: tensors, per-sample numpy columns and batch-level meta_info.

    Build one with :meth:`from_dict` or :meth:`from_single_dict`. Construction checks
    that every column has one row per sample (:meth:`check_consistency`).
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # None means "nothing here" for both dicts, as in verl (DataProto(non_tensor_batch=None)).
        non_tensor: dict[str, Any] | None = self.non_tensor_batch
        self.non_tensor_batch = {
            key: to_numpy_column(key, value) for key, value in (non_tensor or {}).items()
        }
        meta: dict[str, Any] | None = self.meta_info
        self.meta_info = {} if meta is None else meta
        self.check_consistency()

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
    ) -> DataProto:
        """Build a DataProto from tensor columns, non-tensor columns and meta_info.

        Every tensor and non-tensor column must have the same length along dim 0.
        Lists and tuples in ``non_tensors`` are converted to numpy arrays.
        """
        if num_batch_dims != 1:
            raise ValueError(
                f"num_batch_dims={num_batch_dims} is not supported; DataProto has one batch "
                f"dimension. Use fold_batch_dim/unfold_batch_dim to group samples."
            )
        tensors = dict(tensors or {})
        non_tensor_batch = {k: to_numpy_column(k, v) for k, v in (non_tensors or {}).items()}
        lengths = {f"tensors[{k!r}]": len(check_tensor_column(k, v)) for k, v in tensors.items()}
        lengths.update({f"non_tensors[{k!r}]": len(v) for k, v in non_tensor_batch.items()})
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"from_dict: columns have different batch sizes {lengths}; every column needs "
                f"one row per sample."
            )
        batch = None
        if tensors:
            batch = TensorDict(tensors, batch_size=[next(iter(lengths.values()))])
        return cls(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(
        cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None
    ) -> DataProto:
        """Build a DataProto from one dict: tensors go to ``batch``, the rest to
        ``non_tensor_batch``."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)

    @classmethod
    def from_tensordict(
        cls,
        tensor_dict: TensorDict,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
    ) -> DataProto:
        """Build a DataProto from one TensorDict (the inverse of :meth:`to_tensordict`).

        Tensors become ``batch`` columns, ``NonTensorStack`` entries non-tensor columns,
        and ``NonTensorData`` entries meta_info (added to the ``meta_info`` given here).
        """
        batch, non_tensor, meta = tensordict_form.parts_from_tensordict(
            tensor_dict, meta_info, num_batch_dims
        )
        return cls(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def to_tensordict(self) -> TensorDict:
        """This DataProto as one TensorDict: tensor columns as they are, non-tensor columns
        as ``NonTensorStack`` (one entry per sample), meta_info entries as ``NonTensorData``.

        The tensors are shared, not copied. Raises ValueError when a key is in two parts.
        """
        return tensordict_form.parts_to_tensordict(
            self.batch, self.non_tensor_batch, self.meta_info, len(self)
        )

    def check_consistency(self) -> None:
        """Raise if a column does not have exactly one row per sample."""
        if self.batch is not None:
            if not isinstance(self.batch, TensorDict):
                raise TypeError(f"batch must be a TensorDict, got {type(self.batch).__name__}")
            if len(self.batch.batch_size) != 1:
                raise ValueError(
                    f"batch has batch_size {list(self.batch.batch_size)}; DataProto needs "
                    f"exactly one batch dimension."
                )
        if not isinstance(self.meta_info, dict):
            raise TypeError(f"meta_info must be a dict, got {type(self.meta_info).__name__}")
        expected = len(self)
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray):
                raise TypeError(f"non_tensor_batch[{key!r}] must be a numpy array")
            if value.shape[0] != expected:
                raise ValueError(
                    f"non_tensor_batch[{key!r}] has {value.shape[0]} rows but the batch has "
                    f"{expected}; every column needs one row per sample."
                )

    # ------------------------------------------------------------------ inspection

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for value in self.non_tensor_batch.values():
            return int(value.shape[0])
        return 0

    @property
    def nbytes(self) -> int:
        """Bytes held by tensor and numpy columns (object arrays count their pointers)."""
        tensor_bytes = 0
        if self.batch is not None:
            columns = tensor_columns(self.batch).values()
            tensor_bytes = sum(t.numel() * t.element_size() for t in columns)
        return tensor_bytes + sum(a.nbytes for a in self.non_tensor_batch.values())

    def __repr__(self) -> str:
        """One line with length and size, then one line per column and the meta_info keys.

        ::

            DataProto(len=8, nbytes=1.2 KiB)
              batch:
                input_ids: int64[8, 16] cpu
              non_tensor_batch:
                uid: object[8]
              meta_info: {temperature=1.0}
        """
        lines = [f"DataProto(len={len(self)}, nbytes={_human_bytes(self.nbytes)})"]
        if self.batch is not None:
            lines.append("  batch:")
            columns = tensor_columns(self.batch).items()
            lines += [f"    {k}: {describe_tensor(v)}" for k, v in columns]
        if self.non_tensor_batch:
            lines.append("  non_tensor_batch:")
            lines += [f"    {k}: {describe_array(v)}" for k, v in self.non_tensor_batch.items()]
        if self.meta_info:
            lines.append(f"  meta_info: {_short_meta(self.meta_info)}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ indexing

    def __getitem__(self, item: int | slice | IndexLike) -> DataProtoItem | DataProto:
        """``data[i]`` -> DataProtoItem; ``data[a:b]`` and ``data[indices]`` -> DataProto."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            return self._item(int(item))
        if isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        raise TypeError(
            f"DataProto indices must be an int, a slice, or an int/bool index array; got "
            f"{type(item).__name__}"
        )

    def _item(self, index: int) -> DataProtoItem:
        length = len(self)
        if not -length <= index < length:
            raise IndexError(f"index {index} is out of range for a DataProto of length {length}")
        return DataProtoItem(
            batch=self.batch[index] if self.batch is not None else None,
            non_tensor_batch={k: v[index] for k, v in self.non_tensor_batch.items()},
            meta_info=self.meta_info,
        )

    def select_idxs(self, idxs: IndexLike) -> DataProto:
        """Rows picked by an int index array (any order, repeats allowed) or a bool mask."""
        rows = as_row_indices(idxs, len(self))
        batch = self.batch[torch.from_numpy(rows)] if self.batch is not None else None
        non_tensor = {k: v[rows] for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def slice(
        self, start: int | None = None, end: int | None = None, step: int | None = None
    ) -> DataProto:
        """Rows ``start:end:step`` (Python slice rules), sharing memory with ``self``."""
        window = slice(start, end, step)
        batch = self.batch[window] if self.batch is not None else None
        non_tensor = {k: v[window] for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    # ------------------------------------------------------------------ columns

    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A DataProto with only the named columns (``None`` keeps every key of that part)."""
        _require_keys("select", "batch", batch_keys, self._batch_keys())
        _require_keys("select", "non_tensor_batch", non_tensor_batch_keys, self.non_tensor_batch)
        _require_keys("select", "meta_info", meta_info_keys, self.meta_info)
        batch = self.batch
        if batch is not None and batch_keys is not None:
            batch = batch.select(*batch_keys)
        non_tensor = _pick(self.non_tensor_batch, non_tensor_batch_keys)
        meta = _pick(self.meta_info, meta_info_keys)
        if deepcopy:
            batch = batch.clone() if batch is not None else None
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> DataProto:
        """Remove the named columns from ``self`` and return them as a new DataProto.

        Every key is checked first: when one is missing nothing is removed.
        """
        batch_keys, non_tensor_batch_keys = (
            list(batch_keys or []),
            list(non_tensor_batch_keys or []),
        )
        meta_info_keys = list(meta_info_keys or [])
        _require_keys("pop", "batch", batch_keys, self._batch_keys())
        _require_keys("pop", "non_tensor_batch", non_tensor_batch_keys, self.non_tensor_batch)
        _require_keys("pop", "meta_info", meta_info_keys, self.meta_info)
        popped_batch = None
        if self.batch is not None:
            popped_batch = TensorDict(
                {k: self.batch.pop(k) for k in batch_keys}, batch_size=self.batch.batch_size
            )
        non_tensor = {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys}
        meta = {k: self.meta_info.pop(k) for k in meta_info_keys}
        return type(self)(batch=popped_batch, non_tensor_batch=non_tensor, meta_info=meta)

    def rename(
        self,
        old_keys: str | Sequence[str] | None = None,
        new_keys: str | Sequence[str] | None = None,
    ) -> DataProto:
        """Rename batch (or non-tensor) columns in place; returns ``self``."""
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys or [])
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys or [])
        if len(old) != len(new):
            raise ValueError(f"rename: {len(old)} old keys {old} but {len(new)} new keys {new}")
        existing = set(self._batch_keys()) | set(self.non_tensor_batch)
        _require_keys("rename", "batch or non_tensor_batch", old, existing)
        clashes = [k for k in new if k in existing and k not in old]
        if clashes or len(set(new)) != len(new):
            raise ValueError(
                f"rename: new key(s) {clashes or new} would overwrite existing columns"
            )
        for old_key, new_key in zip(old, new, strict=True):
            if self.batch is not None and old_key in self.batch:
                self.batch.rename_key_(old_key, new_key)
            else:
                self.non_tensor_batch[new_key] = self.non_tensor_batch.pop(old_key)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Add ``other``'s columns and meta_info to ``self`` in place; returns ``self``.

        Both must have the same length, unless one holds meta_info only.

        Keys present on both sides must hold equal values. Everything is checked
        before anything changes, so on error ``self`` is untouched.
        """
        if _has_columns(self) and _has_columns(other) and len(self) != len(other):
            raise ValueError(
                f"union: lengths differ ({len(self)} vs {len(other)}); both DataProtos must "
                f"describe the same samples."
            )
        # Dry runs on shallow copies find every conflict before self changes.
        if self.batch is not None and other.batch is not None:
            union_tensor_dict(self.batch.copy(), other.batch)
        union_numpy_dict(dict(self.non_tensor_batch), other.non_tensor_batch)
        union_meta_info(dict(self.meta_info), other.meta_info)
        if other.batch is not None:
            if self.batch is None:
                self.batch = other.batch.copy()
            else:
                union_tensor_dict(self.batch, other.batch)
        union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        union_meta_info(self.meta_info, other.meta_info)
        return self

    def _batch_keys(self) -> list[str]:
        return list(tensor_columns(self.batch)) if self.batch is not None else []

    # ------------------------------------------------------------------ split and merge

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into exactly ``chunks`` contiguous parts whose sizes differ by at most one.

        10 rows in 4 chunks -> 3/3/2/2, order kept. Parts share memory with ``self``.
        """
        sizes = balanced_chunk_sizes(len(self), chunks)
        return [self.slice(start, stop) for start, stop in offsets(sizes)]

    def split(self, split_size: int) -> list[DataProto]:
        """Split into parts of ``split_size`` rows; the last part holds the remainder."""
        sizes = fixed_split_sizes(len(self), split_size)
        return [self.slice(start, stop) for start, stop in offsets(sizes)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Join DataProtos with the same columns, in order.

        meta_info keys must agree between parts, except ``metrics``: every part's
        metrics dict merges into one dict name -> list of values.
        """
        if not data:
            raise ValueError("concat needs at least one DataProto, got an empty list")
        first = data[0]
        for index, part in enumerate(data[1:], start=1):
            _check_same_columns(first, part, index)
        batch = None
        if first.batch is not None:
            columns = [tensor_columns(part.batch) for part in data if part.batch is not None]
            joined = {key: cat_rows([c[key] for c in columns]) for key in columns[0]}
            rows = sum(len(part) for part in data)
            batch = TensorDict(joined, batch_size=[rows], device=first.batch.device)
        non_tensor = {
            key: np.concatenate([part.non_tensor_batch[key] for part in data])
            for key in first.non_tensor_batch
        }
        meta = merge_concat_meta_info([part.meta_info for part in data])
        return type(first)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    # ------------------------------------------------------------------ reorder and repeat

    def reorder(self, indices: IndexLike) -> None:
        """Reorder rows in place: row ``i`` becomes old row ``indices[i]``."""
        reordered = self.select_idxs(indices)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Every row ``repeat_times`` times: ``aabb`` when ``interleave`` else ``abab``."""
        if isinstance(repeat_times, bool) or not isinstance(repeat_times, int) or repeat_times < 1:
            raise ValueError(f"repeat_times must be a positive integer, got {repeat_times!r}")
        rows = np.arange(len(self))
        order = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        return self.select_idxs(order)

    def sample_level_repeat(self, repeat_times: IndexLike) -> DataProto:
        """Row ``i`` repeated ``repeat_times[i]`` times (0 drops it), order kept."""
        counts = np.asarray(
            repeat_times.cpu().numpy() if isinstance(repeat_times, torch.Tensor) else repeat_times
        )
        if counts.shape != (len(self),) or not np.issubdtype(counts.dtype, np.integer):
            raise ValueError(
                f"sample_level_repeat needs one integer count per row ({len(self)} rows), got "
                f"{counts.dtype} array of shape {counts.shape}"
            )
        if (counts < 0).any():
            raise ValueError(f"sample_level_repeat counts must be >= 0, got {counts.tolist()}")
        return self.select_idxs(np.repeat(np.arange(len(self)), counts))

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: dict[str, Any] | None = None,
    ) -> Iterator[DataProto]:
        """Yield mini-batches of ``mini_batch_size`` rows for ``epochs`` passes over the rows,
        for the inner epochs of a PPO-style update.

        ``dataloader_kwargs`` accepts ``shuffle`` (default False; the rows are permuted anew
        every epoch by a generator seeded with ``seed``) and ``drop_last`` (default False: a
        final smaller mini-batch is kept when ``mini_batch_size`` does not divide the length).
        Arguments are checked when this is called, not at the first ``next``.
        """
        options = {"shuffle": False, "drop_last": False}
        unknown = set(dataloader_kwargs or {}) - set(options)
        if unknown:
            raise ValueError(
                f"make_iterator: unsupported dataloader_kwargs {sorted(unknown)}; "
                f"supported: {sorted(options)}"
            )
        options.update(dataloader_kwargs or {})
        sizes = fixed_split_sizes(len(self), mini_batch_size)
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
        generator = torch.Generator()
        if seed is not None:
            generator.manual_seed(seed)
        drop_last = options["drop_last"]
        bounds = [(a, b) for a, b in offsets(sizes) if not (drop_last and b - a < mini_batch_size)]
        return _mini_batches(self, bounds, epochs, generator if options["shuffle"] else None)

    # ------------------------------------------------------------------ batch dimension

    def fold_batch_dim(self, new_batch_size: int) -> DataProto:
        """Group consecutive rows: ``[N, ...]`` -> ``[new_batch_size, N // new_batch_size, ...]``.

        Treats the ``n`` responses of one prompt as one row (e.g. for group-wise advantages);
        undo with :meth:`unfold_batch_dim`.
        """
        length = len(self)
        if isinstance(new_batch_size, bool) or new_batch_size < 1 or length % new_batch_size:
            raise ValueError(
                f"fold_batch_dim: new_batch_size={new_batch_size} must be positive and divide "
                f"the length {length}"
            )
        group = length // new_batch_size
        return self._reshaped(new_batch_size, lambda shape: [new_batch_size, group, *shape[1:]])

    def unfold_batch_dim(self, batch_dims: int = 2) -> DataProto:
        """Merge the first ``batch_dims`` dimensions of every column (undoes a fold)."""
        if isinstance(batch_dims, bool) or batch_dims < 1:
            raise ValueError(f"unfold_batch_dim: batch_dims must be >= 1, got {batch_dims}")
        shapes = [v.shape for v in self.non_tensor_batch.values()]
        if self.batch is not None:
            shapes += [v.shape for v in tensor_columns(self.batch).values()]
        leading = {tuple(shape[:batch_dims]) for shape in shapes}
        if len(leading) > 1:
            raise ValueError(
                f"unfold_batch_dim: columns disagree on their first {batch_dims} dimensions "
                f"{sorted(leading)}"
            )
        rows = math.prod(leading.pop()) if leading else len(self)
        return self._reshaped(rows, lambda shape: [rows, *shape[batch_dims:]])

    def _reshaped(self, rows: int, shape_of: Callable[[tuple[int, ...]], list[int]]) -> DataProto:
        """Every column reshaped by ``shape_of`` into ``rows`` rows; meta_info copied."""
        batch = None
        if self.batch is not None:
            tensors = tensor_columns(self.batch).items()
            columns = {k: v.reshape(shape_of(v.shape)) for k, v in tensors}
            batch = TensorDict(columns, batch_size=[rows])
        non_tensor = {k: v.reshape(shape_of(v.shape)) for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    # ------------------------------------------------------------------ devices, pickling, files

    def to(self, device: str | torch.device) -> DataProto:
        """Move the tensors to ``device`` in place; returns ``self``."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def __getstate__(self) -> dict[str, Any]:
        return transport.encode_state(self.batch, self.non_tensor_batch, self.meta_info)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.batch, self.non_tensor_batch, self.meta_info = transport.decode_state(state)

    def save_to_disk(self, filepath: str | os.PathLike[str]) -> None:
        """Write to ``filepath`` in the safe archive format described in ``hf_protocol.storage``."""
        storage.save_parts(filepath, self.batch, self.non_tensor_batch, self.meta_info, len(self))

    @staticmethod
    def load_from_disk(filepath: str | os.PathLike[str], allow_pickle: bool = False) -> DataProto:
        """Read a file written by :meth:`save_to_disk`.

        Columns that are not tensors, numbers or strings were pickled; reading them
        needs ``allow_pickle=True``, which runs pickle: pass it only for trusted files.
        """
        batch, non_tensor, meta = storage.load_parts(filepath, allow_pickle=allow_pickle)
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)


def _mini_batches(
    data: DataProto,
    bounds: list[tuple[int, int]],
    epochs: int,
    generator: torch.Generator | None,
) -> Iterator[DataProto]:
    for _ in range(epochs):
        if generator is None:
            yield from (data.slice(start, stop) for start, stop in bounds)
        else:
            order = torch.randperm(len(data), generator=generator)
            yield from (data.select_idxs(order[start:stop]) for start, stop in bounds)


def _human_bytes(count: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _short_meta(meta: dict[str, Any]) -> str:
    """Scalars shown by value, anything else by type name, each cut to 40 characters."""
    parts = []
    for key, value in meta.items():
        text = repr(value) if isinstance(value, (int, float, str, bool)) else type(value).__name__
        parts.append(f"{key}={text[:40]}")
    return "{" + ", ".join(parts) + "}"


def _has_columns(data: DataProto) -> bool:
    """False for a DataProto that holds only meta_info (it fits any length)."""
    return data.batch is not None or bool(data.non_tensor_batch)


def _require_keys(method: str, part: str, keys: Sequence[str] | None, available: Any) -> None:
    missing = [k for k in (keys or []) if k not in available]
    if missing:
        raise KeyError(f"{method}: {part} has no key(s) {missing}; available: {sorted(available)}")


def _pick(values: dict[str, Any], keys: Sequence[str] | None) -> dict[str, Any]:
    return dict(values) if keys is None else {k: values[k] for k in keys}


def _check_same_columns(first: DataProto, part: DataProto, index: int) -> None:
    if (first.batch is None) != (part.batch is None):
        has = "has no" if part.batch is None else "has a"
        raise ValueError(
            f"concat: part {index} {has} tensor batch but part 0 does not agree; give every "
            f"part the same tensor columns before concat."
        )
    for name, expected, got in (
        ("batch", first._batch_keys(), part._batch_keys()),
        ("non_tensor_batch", list(first.non_tensor_batch), list(part.non_tensor_batch)),
    ):
        if set(expected) != set(got):
            raise ValueError(
                f"concat: part {index} has {name} keys {sorted(got)} but part 0 has "
                f"{sorted(expected)}; select the same columns on every part before concat."
            )
