"""The weight channel's wire format: how a push's tensors are cut into buckets, laid out in
bytes and described in each bucket's head.

A *push* is one sync of the weight-sync stream of DESIGN.md, ``(name, full tensor)`` in the
actor's order (:data:`NamedTensors`), cut into buckets of at most ``bucket_bytes``
(:func:`cut`), and it carries a *version* (the policy version of these weights). Per bucket
the sender broadcasts

1. ``head``: :data:`HEAD_BYTES` bytes: int64 ``[header_len, packed_len, last, version,
   bucket index, index of its first tensor]`` and the header, the pickled ``(name, dtype,
   shape, offset, nbytes, direct, checksum)`` of each tensor (:class:`Entry`; a header too
   long for the head follows in a broadcast of its own); ``last`` says no bucket follows,
   and a head with ``header_len == 0`` is an empty push (:func:`encode_head`,
   :func:`read_sizes`, :func:`decode_head`);
2. ``packed``: the bytes of the bucket's small tensors, each at an offset aligned to
   :data:`ALIGN` (left out when the bucket has none);
3. each *direct* tensor (at least ``direct_bytes``, or alone in its bucket) on its own,
   from its own memory: no packing copy on the sender (:func:`layout`).

Each entry carries the :func:`~hf_rollout.weight_sync.checksum.checksum` of the bytes that
go on the wire. Each collective has a fixed cost (about 0.2-0.5 ms over gloo on a loaded
2-core machine), which is why small tensors are packed and the head carries sizes, header
and end marker in one broadcast.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

__all__ = [
    "ALIGN",
    "DIRECT_BYTES",
    "HEAD_BYTES",
    "Bucket",
    "Entry",
    "Head",
    "NamedTensors",
    "aligned",
    "as_bytes",
    "cut",
    "decode_head",
    "encode_head",
    "layout",
    "named_pairs",
    "read_sizes",
    "typed",
]

NamedTensors = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]
"""Full weights as ``(name, tensor)`` pairs or a name -> tensor mapping (names as in the
Hugging Face model's ``state_dict()``): what a push carries, and what a rollout worker's
``update_weights`` takes. :func:`named_pairs` turns either into pairs."""

DIRECT_BYTES = 2 << 20
"""Tensors of at least this many bytes travel unpacked: below it, one more collective costs
more than packing and unpacking the bytes (measured over gloo on 2 cores)."""

ALIGN = 16
"""Byte alignment of each tensor in a bucket, so a slice can be viewed as any dtype."""

HEAD_BYTES = 16 << 10
"""Size of a bucket's head broadcast (sizes, end flag and, when it fits, the header)."""

_SIZES = 6  # int64 [header_len, packed_len, last, version, bucket, first tensor]
_SIZES_BYTES = _SIZES * 8


@dataclass(frozen=True)
class Entry:
    """One tensor of a bucket, as its header describes it."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    """Byte offset in the bucket's packed bytes (sender's snapshot: in its buffer)."""
    nbytes: int
    direct: bool
    """Broadcast on its own, after the packed bytes."""
    crc: int = 0
    """Checksum of the tensor's bytes (:func:`~hf_rollout.weight_sync.checksum.checksum`)."""


@dataclass
class Bucket:
    """A bucket ready to go: its header, packed bytes and direct tensors (flat uint8)."""

    entries: list[Entry]
    packed: torch.Tensor | None
    direct: list[torch.Tensor]

    @property
    def packed_len(self) -> int:
        """Bytes of the packed tensors (0: none)."""
        return 0 if self.packed is None else self.packed.numel()


@dataclass(frozen=True)
class Head:
    """What a bucket's head says."""

    packed_len: int
    last: bool
    version: int
    index: int
    first: int
    """Position of the bucket's first tensor in the push."""
    entries: list[Entry]


def named_pairs(named_tensors: NamedTensors) -> Iterable[tuple[str, torch.Tensor]]:
    """``named_tensors`` as ``(name, tensor)`` pairs (a mapping's items)."""
    if isinstance(named_tensors, Mapping):
        return named_tensors.items()
    return named_tensors


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGN`."""
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def cut(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[tuple[list[tuple[str, torch.Tensor]], bool]]:
    """Consecutive runs of ``named_tensors`` of at most ``bucket_bytes`` (aligned; a bigger
    tensor alone), each with whether it is the last (known without waiting: a run is cut
    when the next tensor has come)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = aligned(tensor.numel() * tensor.element_size())
        if bucket and size + nbytes > bucket_bytes:
            yield bucket, False
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket, True


def layout(
    tensors: list[tuple[str, torch.Tensor]], direct_bytes: int, copy_direct: bool = False
) -> tuple[list[Entry], int, int]:
    """Where each of a bucket's ``tensors`` goes: its entries (checksums not yet taken), the
    packed bytes' length, and the buffer bytes needed. Small tensors are packed at aligned
    offsets; a tensor of at least ``direct_bytes``, or alone in its bucket, is direct
    (``copy_direct``: it still gets an offset in the buffer, after the packed bytes)."""
    entries, offset = [], 0
    alone = len(tensors) == 1
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        direct = nbytes > 0 and (alone or nbytes >= direct_bytes)
        entries.append(
            Entry(name, tensor.dtype, tuple(tensor.shape), -1 if direct else offset, nbytes, direct)
        )
        if not direct:
            offset += aligned(nbytes)
    packed_len = offset
    if copy_direct:
        for i, entry in enumerate(entries):
            if entry.direct:
                entries[i] = replace(entry, offset=offset)
                offset += aligned(entry.nbytes)
    return entries, packed_len, offset


def encode_head(head: Head) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A bucket's head broadcast (:data:`HEAD_BYTES` on the CPU), and its header as a
    broadcast of its own when it does not fit in the head (else ``None``)."""
    header = b"" if not head.entries else pickle.dumps([_fields(e) for e in head.entries])
    sizes = [len(header), head.packed_len, int(head.last), head.version, head.index, head.first]
    data = torch.zeros(HEAD_BYTES, dtype=torch.uint8)
    data[:_SIZES_BYTES] = torch.tensor(sizes, dtype=torch.int64).view(torch.uint8)
    if len(header) > HEAD_BYTES - _SIZES_BYTES:
        return data, _from_bytes(header)
    if header:
        data[_SIZES_BYTES : _SIZES_BYTES + len(header)] = _from_bytes(header)
    return data, None


def read_sizes(data: torch.Tensor) -> tuple[list[int], torch.Tensor | None]:
    """A received head (on the CPU): its sizes ``[header_len, packed_len, last, version,
    index, first]``, and its header when it came inline (``None``: it follows in a
    broadcast of ``header_len`` bytes, or the push is empty)."""
    sizes = data[:_SIZES_BYTES].view(torch.int64).tolist()
    header_len = sizes[0]
    if header_len == 0 or header_len > HEAD_BYTES - _SIZES_BYTES:
        return sizes, None
    return sizes, data[_SIZES_BYTES : _SIZES_BYTES + header_len]


def decode_head(sizes: list[int], header: torch.Tensor | None) -> Head:
    """The head of ``sizes`` and ``header`` (:func:`read_sizes`, or the header's own
    broadcast; ``None`` only for an empty push); raises whatever unpickling an unreadable
    header raises."""
    header_len, packed_len, last, version, index, first = sizes
    if header_len == 0:
        return Head(0, True, version, index, first, [])
    assert header is not None, "a head with a header needs its bytes"
    fields = pickle.loads(header.cpu().numpy().tobytes())
    return Head(packed_len, bool(last), version, index, first, [Entry(*f) for f in fields])


def typed(raw: torch.Tensor, entry: Entry) -> torch.Tensor:
    """Flat bytes ``raw`` as the entry's dtype and shape (a view)."""
    return raw.view(entry.dtype).view(entry.shape)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat uint8 view (a copy only if it is not contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _fields(entry: Entry) -> tuple[Any, ...]:
    """The entry as a plain tuple (pickles in a third of the bytes of the dataclass)."""
    return (
        entry.name,
        entry.dtype,
        entry.shape,
        entry.offset,
        entry.nbytes,
        entry.direct,
        entry.crc,
    )


def _from_bytes(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)
