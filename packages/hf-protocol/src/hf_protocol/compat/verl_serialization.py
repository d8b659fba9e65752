"""verl's tensor and TensorDict (de)serialization helpers as plain tuples.

verl exposes these from ``verl.protocol`` for code that sends a TensorDict as numpy
bytes instead of through ``torch.save``. The encodings:

* a tensor: ``(dtype_name, shape, uint8 bytes)``, e.g. ``("bfloat16", (2, 3), array)``;
* a nested tensor: ``(layout_name, [tensor encoding per component])``;
* a TensorDict: ``(batch_size, device or None, {key: tensor or nested encoding})``.

hf-protocol's own pickling (``hf_protocol.transport``) already sends tensors as bytes;
these functions exist for verl code that calls them by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from hf_protocol.columns import dtype_from_name
from hf_protocol.transport import tensor_from_bytes, tensor_to_bytes_view

TensorEncoding = tuple[str, tuple[int, ...], np.ndarray]


def serialize_single_tensor(obj: torch.Tensor) -> TensorEncoding:
    """``(dtype_name, shape, uint8 bytes)`` of a (non-nested) tensor."""
    dtype = str(obj.dtype).removeprefix("torch.")
    return dtype, tuple(obj.shape), tensor_to_bytes_view(obj)


def deserialize_single_tensor(arr: Any) -> torch.Tensor:
    """The tensor of a :func:`serialize_single_tensor` tuple, in its own writable memory."""
    dtype, shape, data = arr
    raw = np.frombuffer(bytearray(memoryview(data)), dtype=np.uint8)
    return tensor_from_bytes(raw, dtype_from_name(dtype), list(shape))


def serialize_tensordict(
    batch: TensorDict,
) -> tuple[tuple[int, ...], str | None, dict[str, Any]]:
    """``(batch_size, device, encodings)`` of a TensorDict of tensors and nested tensors."""
    encoded: dict[str, Any] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"serialize_tensordict: {key!r} is a {type(value).__name__}; only tensors "
                f"and nested tensors can be serialized this way"
            )
        if value.is_nested:
            layout = str(value.layout).removeprefix("torch.")
            encoded[key] = (layout, [serialize_single_tensor(t) for t in value.unbind()])
        else:
            encoded[key] = serialize_single_tensor(value)
    device = str(batch.device) if batch.device is not None else None
    return tuple(batch.batch_size), device, encoded


def deserialize_tensordict(arr: Any) -> TensorDict:
    """The TensorDict of a :func:`serialize_tensordict` tuple."""
    batch_size, device, encoded = arr
    tensors: dict[str, torch.Tensor] = {}
    for key, value in encoded.items():
        if len(value) == 3:
            tensors[key] = deserialize_single_tensor(value)
        elif len(value) == 2:
            layout_name, components = value
            layout = getattr(torch, layout_name, None)
            if not isinstance(layout, torch.layout):
                raise ValueError(f"deserialize_tensordict: {layout_name!r} is not a torch layout")
            parts = [deserialize_single_tensor(c) for c in components]
            tensors[key] = torch.nested.as_nested_tensor(parts, layout=layout)
        else:
            raise ValueError(
                f"deserialize_tensordict: {key!r} has an encoding of {len(value)} fields; "
                f"expected 3 (a tensor) or 2 (a nested tensor)"
            )
    return TensorDict(tensors, batch_size=list(batch_size), device=device)
