"""Checksums of the weight channel's buckets: taken by the sender, verified by the receivers.

On the CPU (gloo) a checksum is ``zlib.crc32`` of a tensor's bytes: exact, and read from
the tensor's memory without a copy. On an accelerator (NCCL) it is a position-weighted sum
of the bytes computed on the device (a CRC there would copy the bytes to the host): it
catches changed, lost or moved blocks of 4 KiB, not two bytes swapped within one block.
"""

from __future__ import annotations

import zlib

import torch

__all__ = ["checksum"]

_BLOCK = 4096
"""Bytes per block of the device checksum."""


def checksum(raw: torch.Tensor) -> int:
    """Checksum of the flat uint8 tensor ``raw`` (see the module docstring)."""
    if raw.numel() == 0:
        return 0
    if raw.device.type == "cpu":
        return zlib.crc32(raw.numpy().data)
    return _device_checksum(raw)


def _device_checksum(raw: torch.Tensor) -> int:
    """Sum of the bytes and sum of the 4 KiB blocks' sums weighted by their position,
    packed into one int (computed on ``raw``'s device; one sync to read it)."""
    whole = raw.numel() // _BLOCK * _BLOCK
    sums = raw[:whole].view(-1, _BLOCK).sum(dim=1, dtype=torch.int64)
    tail = raw[whole:].sum(dtype=torch.int64).reshape(1)
    sums = torch.cat([sums, tail])
    weights = torch.arange(1, sums.numel() + 1, device=raw.device, dtype=torch.int64)
    plain, weighted = torch.stack([sums.sum(), (sums * weights).sum()]).tolist()
    return (int(plain) & 0xFFFFFFFF) | ((int(weighted) & 0xFFFFFFFF) << 32) | (raw.numel() << 64)
