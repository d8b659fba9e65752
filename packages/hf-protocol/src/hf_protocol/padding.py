"""Padding a DataProto to a multiple of a size, for callers that need equal shards.

``DataProto.chunk`` already handles uneven batches (balanced parts), so padding is
only for code that insists on equal shapes, e.g. a collective that needs the same
number of rows on every rank.
"""

from __future__ import annotations

import numpy as np

from hf_protocol.data_proto import DataProto


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append rows (copies of the first rows, cycling) until the length divides ``size_divisor``.

    Returns ``(padded, pad_size)``; undo with :func:`unpad_dataproto`.
    """
    if isinstance(size_divisor, bool) or not isinstance(size_divisor, int) or size_divisor < 1:
        raise ValueError(f"size_divisor must be a positive integer, got {size_divisor!r}")
    length = len(data)
    pad_size = -length % size_divisor
    if pad_size == 0:
        return data, 0
    if length == 0:
        raise ValueError("cannot pad an empty DataProto: there are no rows to repeat")
    return data.select_idxs(np.arange(length + pad_size) % length), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows added by :func:`pad_dataproto_to_divisor`."""
    if pad_size < 0 or pad_size > len(data):
        raise ValueError(f"pad_size must be in [0, {len(data)}] for this DataProto, got {pad_size}")
    if pad_size == 0:
        return data
    return data.slice(0, len(data) - pad_size)
