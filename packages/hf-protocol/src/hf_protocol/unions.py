"""Merging two column dictionaries that describe the same samples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from tensordict import TensorDict

from hf_protocol import fields
from hf_protocol.columns import values_equal


def _conflicting_keys(left: Mapping[str, Any], right: Mapping[str, Any]) -> list[str]:
    return [k for k in right if k in left and not values_equal(left[k], right[k])]


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add the columns of ``tensor_dict2`` to ``tensor_dict1`` in place and return it.

    Keys present in both must hold equal tensors. Everything is checked before
    anything is written, so on error ``tensor_dict1`` is unchanged.
    """
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ValueError(
            f"union_tensor_dict: batch sizes differ ({list(tensor_dict1.batch_size)} vs "
            f"{list(tensor_dict2.batch_size)}); both must describe the same samples."
        )
    left = dict(tensor_dict1.items())
    right = dict(tensor_dict2.items())
    conflicts = _conflicting_keys(left, right)
    if conflicts:
        raise ValueError(
            f"union_tensor_dict: key(s) {conflicts} exist in both with different values. "
            f"Rename one side (DataProto.rename) or pop the stale column before the union."
        )
    for key, value in right.items():
        if key not in left:
            tensor_dict1.set(key, value)
    return tensor_dict1


def union_numpy_dict(
    tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Add the arrays of ``tensor_dict2`` to ``tensor_dict1`` in place and return it.

    Keys present in both must hold equal arrays (object arrays compared element by
    element, NaN equal to NaN). On error ``tensor_dict1`` is unchanged.
    """
    conflicts = _conflicting_keys(tensor_dict1, tensor_dict2)
    if conflicts:
        raise ValueError(
            f"union_numpy_dict: key(s) {conflicts} exist in both with different values. "
            f"Rename one side (DataProto.rename) or pop the stale column before the union."
        )
    for key, value in tensor_dict2.items():
        tensor_dict1.setdefault(key, value)
    return tensor_dict1


def union_meta_info(meta1: dict[str, Any], meta2: dict[str, Any]) -> dict[str, Any]:
    """Add the entries of ``meta2`` to ``meta1`` in place; shared keys must agree."""
    conflicts = _conflicting_keys(meta1, meta2)
    if conflicts:
        raise ValueError(
            f"union: meta_info key(s) {conflicts} differ between the two DataProtos "
            f"({[(meta1[k], meta2[k]) for k in conflicts]!r:.200}). Drop or rename one."
        )
    for key, value in meta2.items():
        meta1.setdefault(key, value)
    return meta1


def merge_concat_meta_info(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """meta_info of ``DataProto.concat``: shared keys must agree, metrics are gathered.

    ``metrics`` of a part is a dict name -> value (or list of values), or a list of
    such dicts (one per worker, as verl's workers report them). Every part's metrics
    merge into one dict name -> list of all values, in order, so per-worker metrics
    survive the gather.
    """
    merged: dict[str, Any] = {}
    metrics: dict[str, list[Any]] = {}
    for index, meta in enumerate(metas):
        for key, value in meta.items():
            if key == fields.METRICS:
                _gather_metrics(metrics, value, index)
            elif key not in merged:
                merged[key] = value
            elif not values_equal(merged[key], value):
                raise ValueError(
                    f"concat: meta_info[{key!r}] differs between parts (part 0 has "
                    f"{merged[key]!r:.80}, part {index} has {value!r:.80}). Make it agree, "
                    f"or report per-part values under meta_info['metrics']."
                )
    if metrics:
        merged[fields.METRICS] = metrics
    return merged


def _gather_metrics(into: dict[str, list[Any]], metrics: Any, part: int) -> None:
    if metrics is None:
        return
    per_worker = metrics if isinstance(metrics, list) else [metrics]
    for entry in per_worker:
        if not isinstance(entry, Mapping):
            raise TypeError(
                f"concat: meta_info['metrics'] of part {part} must be a dict name -> value or "
                f"a list of such dicts, got {type(metrics).__name__} holding "
                f"{type(entry).__name__}"
            )
        for name, value in entry.items():
            bucket = into.setdefault(name, [])
            if isinstance(value, list):
                bucket.extend(value)
            else:
                bucket.append(value)
