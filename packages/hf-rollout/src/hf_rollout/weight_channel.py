"""A direct actor -> rollout weight channel: a torch.distributed group beside the default one.

The ``separate`` placement keeps the actor and the rollout in different processes. Weights
must not travel through the driver (DESIGN.md, "Two planes"), so actor rank 0 and every
rollout rank join one extra process group: channel rank 0 sends, channel ranks ``1..R``
receive. The group is built from the public constructors (``TCPStore`` +
``ProcessGroupGloo`` / ``ProcessGroupNCCL``) and used through its own collectives, so the
workers' default process groups are never touched.

One sync is the weight-sync stream of DESIGN.md, ``(name, full tensor)`` in the actor's
order, cut into buckets of at most ``bucket_bytes``. Per bucket the sender broadcasts

1. ``sizes``: an int64 tensor ``[header_len, buffer_len]`` (``[0, 0]`` ends the sync);
2. ``header``: the pickled list of ``(name, dtype, shape, offset)`` as uint8;
3. ``buffer``: the tensors' bytes, packed, each at an offset aligned to :data:`ALIGN`.

A tensor larger than the bucket goes alone, sent from its own memory without a copy. The
sender packs the next bucket while the last one is on the wire (two reused buffers); the
receiver yields views into one bucket buffer while the next bucket arrives in the other,
so a consumer that copies them (a rollout engine's ``update_weights``) overlaps the
transfer and the channel holds two buckets per side.
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DEFAULT_TIMEOUT_S", "WeightChannel", "WeightChannelError"]

DEFAULT_TIMEOUT_S = 300.0
"""How long a join or a collective waits for a peer before the channel gives up."""

ALIGN = 16
"""Byte alignment of each tensor in a bucket, so a slice can be viewed as any dtype."""

_PREFIX = "hf_weight_channel"


class WeightChannelError(RuntimeError):
    """A peer did not join, died, or broke the protocol; the message names the channel."""


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class WeightChannel:
    """One member of a weight channel: rank 0 sends, ranks ``1..world_size-1`` receive.

    Build it with :meth:`join` on every member at the same time (it is a rendezvous).
    """

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        device: str | torch.device = "cpu",
    ) -> None:
        self.host, self.port = host, int(port)
        self.rank, self.world_size = rank, world_size
        self.timeout_s = timeout_s
        self.device = torch.device(device)
        self._pg: Any = None
        self._store: Any = None
        self._buffers: dict[int, torch.Tensor] = {}

    @classmethod
    def join(
        cls,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        device: str | torch.device = "cpu",
    ) -> WeightChannel:
        """Join the channel at ``host:port`` as ``rank`` of ``world_size``.

        Rank 0 hosts the rendezvous store. Blocks until every member joined; raises
        :class:`WeightChannelError` naming the address and ranks after ``timeout_s``.
        ``device="cuda"`` uses NCCL (tensors on the GPU), otherwise gloo.
        """
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(
                f"a weight channel needs world_size >= 2 (one sender, >= 1 receiver) and "
                f"0 <= rank < world_size; got rank={rank}, world_size={world_size}"
            )
        channel = cls(host, port, rank, world_size, timeout_s, device)
        channel._connect()
        return channel

    def __repr__(self) -> str:
        return (
            f"WeightChannel({self.host}:{self.port}, rank {self.rank} of {self.world_size}, "
            f"{self.device.type})"
        )

    def _describe(self) -> str:
        return (
            f"weight channel {self.host}:{self.port} (this is rank {self.rank}; rank 0 is the "
            f"actor's rank 0, ranks 1..{self.world_size - 1} the rollout ranks)"
        )

    def _connect(self) -> None:
        timeout = datetime.timedelta(seconds=self.timeout_s)
        try:
            self._store = dist.TCPStore(
                self.host, self.port, self.world_size, is_master=self.rank == 0, timeout=timeout
            )
            store = dist.PrefixStore(_PREFIX, self._store)
            if self.device.type == "cuda":
                nccl = getattr(dist, "ProcessGroupNCCL", None)
                if nccl is None:
                    raise RuntimeError("this torch build has no NCCL; use device='cpu'")
                options = nccl.Options()
                options._timeout = timeout
                self._pg = nccl(store, self.rank, self.world_size, options)
            else:
                self._pg = dist.ProcessGroupGloo(store, self.rank, self.world_size, timeout)
        except Exception as error:  # c10d raises several types; say which channel failed
            raise WeightChannelError(
                f"{self._describe()}: joining failed within {self.timeout_s:.0f} s: {error}. "
                f"Every member must join at the same time; check that all {self.world_size} "
                f"ranks are alive and that {self.host}:{self.port} is reachable"
            ) from error

    def _start(self, tensor: torch.Tensor, what: str) -> _Pending:
        """Issue a broadcast from rank 0 without waiting (gloo runs it in the background,
        in issue order)."""
        if self._pg is None:
            raise WeightChannelError(f"{self._describe()}: the channel is closed")
        options = dist.BroadcastOptions()
        options.rootRank = 0
        try:
            return _Pending(self._pg.broadcast([tensor], options), tensor, what)
        except Exception as error:
            raise self._failed(what, error) from error

    def _finish(self, pending: list[_Pending]) -> None:
        for item in pending:
            try:
                item.work.wait()
            except Exception as error:
                raise self._failed(item.what, error) from error
        pending.clear()

    def _broadcast(self, tensor: torch.Tensor, what: str) -> None:
        self._finish([self._start(tensor, what)])

    def _failed(self, what: str, error: Exception) -> WeightChannelError:
        return WeightChannelError(
            f"{self._describe()}: broadcast of the {what} failed (a peer died, left or took "
            f"longer than {self.timeout_s:.0f} s): {error}"
        )

    def _bucket_buffer(self, slot: int, nbytes: int) -> torch.Tensor:
        """Buffer ``slot`` with room for ``nbytes``, reused across buckets and syncs (fresh
        memory would pay its page faults on every bucket)."""
        buffer = self._buffers.get(slot)
        if buffer is None or buffer.numel() < nbytes:
            buffer = self._buffers[slot] = torch.empty(
                nbytes, dtype=torch.uint8, device=self.device
            )
        return buffer[:nbytes]

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> int:
        """Stream ``named_tensors`` to every receiver, then the end marker; rank 0 only.

        Consecutive tensors are packed into buckets of at most ``bucket_bytes``; the
        iterator is consumed lazily. Two bucket buffers alternate, so packing the next
        bucket overlaps sending this one; the sender holds about two buckets. Returns the
        number of tensor bytes sent.
        """
        if self.rank != 0:
            raise WeightChannelError(f"{self._describe()}: only rank 0 sends")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        total, slot = 0, 0
        in_flight: list[list[_Pending]] = [[], []]
        pending: list[tuple[str, torch.Tensor]] = []
        pending_bytes = 0
        try:
            for name, tensor in named_tensors:
                nbytes = tensor.numel() * tensor.element_size()
                if pending and pending_bytes + _aligned(nbytes) > bucket_bytes:
                    self._finish(in_flight[slot])  # this slot's buffer is free again
                    in_flight[slot] = self._send_bucket(pending, slot)
                    pending, pending_bytes, slot = [], 0, 1 - slot
                pending.append((name, tensor))
                pending_bytes += _aligned(nbytes)
                total += nbytes
            if pending:
                self._finish(in_flight[slot])
                in_flight[slot] = self._send_bucket(pending, slot)
            end = torch.zeros(2, dtype=torch.int64, device=self.device)
            in_flight[slot].append(self._start(end, "end marker"))
        finally:
            for items in in_flight:
                self._finish(items)
        return total

    def _send_bucket(self, tensors: list[tuple[str, torch.Tensor]], slot: int) -> list[_Pending]:
        entries, offset = [], 0
        for name, tensor in tensors:
            nbytes = tensor.numel() * tensor.element_size()
            entries.append(_Entry(name, tensor.dtype, tuple(tensor.shape), offset, nbytes))
            offset += _aligned(nbytes)
        if len(tensors) == 1:  # a lone tensor (e.g. bigger than a bucket) goes without a copy
            buffer = _as_bytes(tensors[0][1]).to(self.device)
        else:
            buffer = self._bucket_buffer(slot, offset)
            for entry, (_, tensor) in zip(entries, tensors, strict=True):
                buffer[entry.offset : entry.offset + entry.nbytes].copy_(_as_bytes(tensor))
        header = torch.frombuffer(bytearray(pickle.dumps(entries)), dtype=torch.uint8)
        sizes = torch.tensor([header.numel(), buffer.numel()], dtype=torch.int64)
        return [
            self._start(sizes.to(self.device), "bucket sizes"),
            self._start(header.to(self.device), "bucket header"),
            self._start(buffer, "bucket"),
        ]

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` pairs of one sync, in the sender's order; ranks ``>= 1``.

        The tensors are views into a bucket buffer (on this channel's device) that the
        next bucket overwrites: copy each one before asking for the next (as a rollout
        engine's ``update_weights`` does). Ends at the sender's end marker.
        """
        if self.rank == 0:
            raise WeightChannelError(f"{self._describe()}: rank 0 sends; receive on ranks >= 1")
        slot = 0
        current = self._receive_head(slot)
        while current is not None:
            entries, buffer, pending = current
            self._finish(pending)
            # Post the next bucket into the other buffer before handing this one out, so it
            # arrives while the consumer copies this one.
            slot = 1 - slot
            current = self._receive_head(slot)
            for entry in entries:
                raw = buffer[entry.offset : entry.offset + entry.nbytes]
                yield entry.name, raw.view(entry.dtype).view(entry.shape)

    def _receive_head(self, slot: int) -> tuple[list[_Entry], torch.Tensor, list[_Pending]] | None:
        """Sizes and header of the next bucket, and its buffer's broadcast in flight into
        buffer ``slot``; ``None`` at the end marker."""
        sizes = torch.zeros(2, dtype=torch.int64, device=self.device)
        self._broadcast(sizes, "bucket sizes")
        header_len, buffer_len = (int(v) for v in sizes.tolist())
        if header_len == 0:
            return None
        header = torch.empty(header_len, dtype=torch.uint8, device=self.device)
        self._broadcast(header, "bucket header")
        entries: list[_Entry] = pickle.loads(header.cpu().numpy().tobytes())
        buffer = self._bucket_buffer(slot, buffer_len)
        return entries, buffer, [self._start(buffer, "bucket")]

    def close(self) -> None:
        """Leave the channel (idempotent); later sends and receives raise."""
        pg, self._pg = self._pg, None
        if pg is not None:
            shutdown = getattr(pg, "shutdown", None)
            if callable(shutdown):
                shutdown()
        self._store = None
        self._buffers.clear()


@dataclass
class _Pending:
    """A broadcast in flight, and the tensor it reads or writes (kept alive until done)."""

    work: Any
    tensor: torch.Tensor
    what: str


def _aligned(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat uint8 view (a copy only if it is not contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)
