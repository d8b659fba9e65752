"""Pickling a DataProto without copying its tensors through ``torch.save``.

``__getstate__`` turns every tensor into a flat ``uint8`` numpy view of its bytes
plus its dtype and shape. Under pickle protocol 5 with a buffer callback (what
Ray's object store uses) numpy hands those bytes over as out-of-band buffers, so
``ray.put`` copies each tensor once into shared memory and ``ray.get`` maps it
back without another copy. Plain ``pickle.dumps`` still works (in-band).

Zero-copy has one consequence worth knowing: a tensor received through Ray's
object store aliases the stored object. Writing into it in place changes what
other readers on the same node see. Clone the columns you modify in place, or set
``HF_PROTOCOL_COPY_ON_RECEIVE=1`` to copy every tensor on arrival (measured at
0.1-0.4x the zero-copy throughput, see docs/benchmarks.md).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from hf_protocol.columns import dtype_from_name, tensor_columns

STATE_VERSION = 1
COPY_ON_RECEIVE_ENV = "HF_PROTOCOL_COPY_ON_RECEIVE"


def tensor_to_bytes_view(tensor: torch.Tensor) -> np.ndarray:
    """A flat ``uint8`` numpy array over the bytes of ``tensor`` (on CPU, contiguous).

    No copy is made for a contiguous CPU tensor; other tensors are copied once.
    """
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


def tensor_from_bytes(data: np.ndarray, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """Rebuild a tensor from the bytes made by :func:`tensor_to_bytes_view`.

    Shares memory with ``data`` unless ``HF_PROTOCOL_COPY_ON_RECEIVE=1`` is set.
    """
    if os.environ.get(COPY_ON_RECEIVE_ENV, "0") == "1":
        data = np.array(data, copy=True)
    with warnings.catch_warnings():
        # Buffers mapped from Ray's object store are read-only to numpy; torch has no
        # read-only tensors and warns. The module docstring documents the aliasing.
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.from_numpy(data)
    return raw.view(dtype).reshape(shape)


def encode_batch(batch: TensorDict | None) -> dict[str, Any] | None:
    """Describe a TensorDict as plain data: batch size and per-key bytes/dtype/shape."""
    if batch is None:
        return None
    columns = {}
    for key, tensor in tensor_columns(batch).items():
        dtype = str(tensor.dtype).removeprefix("torch.")
        columns[key] = (tensor_to_bytes_view(tensor), dtype, list(tensor.shape))
    return {"batch_size": list(batch.batch_size), "columns": columns}


def decode_batch(encoded: dict[str, Any] | None) -> TensorDict | None:
    """Inverse of :func:`encode_batch`."""
    if encoded is None:
        return None
    tensors = {
        key: tensor_from_bytes(data, dtype_from_name(dtype), shape)
        for key, (data, dtype, shape) in encoded["columns"].items()
    }
    return TensorDict(tensors, batch_size=encoded["batch_size"])


def encode_state(
    batch: TensorDict | None, non_tensor_batch: dict[str, np.ndarray], meta_info: dict[str, Any]
) -> dict[str, Any]:
    """The pickled state of a DataProto (see module docstring)."""
    return {
        "version": STATE_VERSION,
        "batch": encode_batch(batch),
        "non_tensor_batch": non_tensor_batch,
        "meta_info": meta_info,
    }


def decode_state(
    state: dict[str, Any],
) -> tuple[TensorDict | None, dict[str, np.ndarray], dict[str, Any]]:
    """Inverse of :func:`encode_state`: ``(batch, non_tensor_batch, meta_info)``."""
    version = state.get("version") if isinstance(state, dict) else None
    if version != STATE_VERSION:
        raise ValueError(
            f"cannot unpickle DataProto state version {version!r}; this hf-protocol "
            f"reads version {STATE_VERSION}. Use the same hf-protocol version on both ends."
        )
    return decode_batch(state["batch"]), state["non_tensor_batch"], state["meta_info"]
