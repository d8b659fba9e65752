"""A direct actor -> rollout weight channel: a torch.distributed group beside the default one.

The ``separate`` placement keeps the actor and the rollout in different processes. Weights
must not travel through the driver (DESIGN.md, "Two planes"), so actor rank 0 and every
rollout rank join one extra process group: channel rank 0 sends, channel ranks ``1..R``
receive. The group is built from the public constructors (``TCPStore`` +
``ProcessGroupGloo`` / ``ProcessGroupNCCL``) and used through its own collectives, so the
workers' default process groups are never touched.

One sync is the weight-sync stream of DESIGN.md, ``(name, full tensor)`` in the actor's
order, cut into buckets of at most ``bucket_bytes``. Per bucket the sender broadcasts

1. ``head``: :data:`HEAD_BYTES` bytes: int64 ``[header_len, packed_len, last]`` and the
   header, the pickled ``(name, dtype, shape, offset, nbytes, direct)`` of each tensor
   (a header too long for the head follows in a broadcast of its own); ``last`` says no
   bucket follows, and a head with ``header_len == 0`` is an empty sync;
2. ``packed``: the bytes of the bucket's small tensors, each at an offset aligned to
   :data:`ALIGN` (left out when the bucket has none);
3. each *direct* tensor (at least ``direct_bytes``, or alone in its bucket) on its own,
   from its own memory: no packing copy on the sender, and a receiver that names a
   destination (``receive(dest)``, e.g. the rollout model's parameters) gets it broadcast
   straight into that tensor: no unpacking copy either.

Each collective has a fixed cost (about 0.2-0.5 ms over gloo on a loaded 2-core machine),
which is why small tensors are packed and the head carries sizes, header and end marker in
one broadcast. The sender packs the next
bucket while the last one is on the wire (two reused buffers); the receiver yields the tensors
of one bucket while the next bucket arrives, so a consumer that copies them (a rollout
engine's ``update_weights``) overlaps the transfer and the channel holds two buckets per side.

:meth:`WeightChannel.send_buffered` takes a snapshot instead: every tensor is copied into
reused buffers and the broadcasts run in the background (gloo's and NCCL's collectives are
asynchronous), so the sender is free as soon as the copy is done and later changes of its
tensors cannot reach the receivers (no torn update).
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hf_protocol.rendezvous import gloo_device_toward, store_on

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DIRECT_BYTES",
    "ChannelMember",
    "WeightChannel",
    "WeightChannelError",
]

DEFAULT_TIMEOUT_S = 300.0
"""How long a join or a collective waits for a peer before the channel gives up."""

DIRECT_BYTES = 2 << 20
"""Tensors of at least this many bytes travel unpacked: below it, one more collective costs
more than packing and unpacking the bytes (measured over gloo on 2 cores)."""

ALIGN = 16
"""Byte alignment of each tensor in a bucket, so a slice can be viewed as any dtype."""

HEAD_BYTES = 16 << 10
"""Size of a bucket's head broadcast (sizes, end flag and, when it fits, the header)."""

_SIZES_BYTES = 24  # int64 [header_len, packed_len, last] at the start of a head

_PREFIX = "hf_weight_channel"

NamedTensors = Iterable[tuple[str, torch.Tensor]]


class WeightChannelError(RuntimeError):
    """A peer did not join, died, or broke the protocol; the message names the channel."""


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    """Byte offset in the bucket's packed bytes (sender's snapshot: in its buffer)."""
    nbytes: int
    direct: bool
    """Broadcast on its own, after the packed bytes."""


@dataclass
class _Bucket:
    """A bucket ready to go: its header, packed bytes and direct tensors (flat uint8)."""

    entries: list[_Entry]
    packed: torch.Tensor | None
    direct: list[torch.Tensor]


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
        direct_bytes: int = DIRECT_BYTES,
    ) -> None:
        self.host, self.port = host, int(port)
        self.rank, self.world_size = rank, world_size
        self.timeout_s = timeout_s
        self.device = torch.device(device)
        self.direct_bytes = direct_bytes
        self._pg: Any = None
        self._store: Any = None
        self._buffers: dict[Any, torch.Tensor] = {}
        self._in_flight: list[_Pending] = []  # a buffered send's broadcasts
        self.last_buckets: list[list[str]] = []
        """Names per bucket of the last sync sent or received (for tests and debugging)."""

    @classmethod
    def join(
        cls,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        device: str | torch.device = "cpu",
        direct_bytes: int = DIRECT_BYTES,
    ) -> WeightChannel:
        """Join the channel at ``host:port`` as ``rank`` of ``world_size``.

        Rank 0 hosts the rendezvous store. Blocks until every member joined; raises
        :class:`WeightChannelError` naming the address and ranks after ``timeout_s``.
        ``device="cuda"`` uses NCCL (tensors on the GPU), otherwise gloo. ``direct_bytes``
        (sender) is the size from which a tensor travels unpacked.
        """
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(
                f"a weight channel needs world_size >= 2 (one sender, >= 1 receiver) and "
                f"0 <= rank < world_size; got rank={rank}, world_size={world_size}"
            )
        if direct_bytes < 1:
            raise ValueError(f"direct_bytes must be positive, got {direct_bytes}")
        channel = cls(host, port, rank, world_size, timeout_s, device, direct_bytes)
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
            self._store = store_on(
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
                gloo: Any = dist.ProcessGroupGloo  # its options type is missing in torch's stubs
                options = gloo._Options()
                options._devices = [gloo_device_toward(self.host)]
                options._timeout = timeout
                self._pg = gloo(store, self.rank, self.world_size, options)
        except Exception as error:  # c10d raises several types; say which channel failed
            raise WeightChannelError(
                f"{self._describe()}: joining failed within {self.timeout_s:.0f} s: {error}. "
                f"Every member must join at the same time; check that all {self.world_size} "
                f"ranks are alive and that {self.host}:{self.port} is reachable"
            ) from error

    # ------------------------------------------------------------------ collectives

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

    def _failed(self, what: str, error: Exception) -> WeightChannelError:
        return WeightChannelError(
            f"{self._describe()}: broadcast of the {what} failed (a peer died, left or took "
            f"longer than {self.timeout_s:.0f} s): {error}"
        )

    def _bucket_buffer(self, slot: Any, nbytes: int) -> torch.Tensor:
        """Buffer ``slot`` with room for ``nbytes``, reused across buckets and syncs (fresh
        memory would pay its page faults on every bucket)."""
        buffer = self._buffers.get(slot)
        if buffer is None or buffer.numel() < nbytes:
            buffer = self._buffers[slot] = torch.empty(
                nbytes, dtype=torch.uint8, device=self.device
            )
        return buffer[:nbytes]

    # ------------------------------------------------------------------ sending

    def send(self, named_tensors: NamedTensors, bucket_bytes: int) -> int:
        """Stream ``named_tensors`` to every receiver, then the end marker; rank 0 only.

        Consecutive tensors are cut into buckets of at most ``bucket_bytes``; the iterator
        is consumed lazily. Small tensors are packed into one of two alternating bucket
        buffers (packing the next bucket overlaps sending this one), direct ones go from
        their own memory; the sender holds about two buckets. Returns when every byte is
        sent (waiting first for a buffered send); returns the number of tensor bytes.
        """
        self._check_sender(bucket_bytes)
        self.wait_sent()
        total, slot = 0, 0
        in_flight: list[list[_Pending]] = [[], []]
        self.last_buckets = []
        try:
            for bucket, last in self._cut(named_tensors, bucket_bytes):
                self._finish(in_flight[slot])  # this slot's buffer is free again
                prepared = self._prepare(bucket, slot)
                in_flight[slot] = self._transmit(prepared, last)
                total += sum(e.nbytes for e in prepared.entries)
                slot = 1 - slot
            if not self.last_buckets:  # nothing to send: an empty sync
                in_flight[slot] = self._transmit(_Bucket([], None, []), last=True)
        finally:
            for items in in_flight:
                self._finish(items)
        return total

    def send_buffered(self, named_tensors: NamedTensors, bucket_bytes: int) -> int:
        """Copy ``named_tensors`` into reused snapshot buffers, issue the broadcasts and
        return without waiting for the receivers; rank 0 only.

        The receivers get the tensors as they were during this call, whatever the caller
        changes afterwards. The sender holds a copy of the whole sync (its buffers are kept
        for the next one). The next ``send``, ``send_buffered`` or :meth:`wait_sent` waits
        for these broadcasts (and raises if one failed). Returns the number of tensor bytes.
        """
        self._check_sender(bucket_bytes)
        self.wait_sent()
        buckets, total = [], 0
        self.last_buckets = []
        for index, (bucket, _) in enumerate(self._cut(named_tensors, bucket_bytes)):
            buckets.append(self._prepare(bucket, ("snapshot", index), copy_direct=True))
            total += sum(e.nbytes for e in buckets[-1].entries)
        pending: list[_Pending] = []
        try:
            for index, prepared in enumerate(buckets or [_Bucket([], None, [])]):
                pending += self._transmit(prepared, last=index >= len(buckets) - 1)
        except BaseException:
            self._finish(pending)
            raise
        self._in_flight = pending
        return total

    def wait_sent(self) -> None:
        """Wait until the broadcasts of the last :meth:`send_buffered` are done (no-op when
        there are none); raises :class:`WeightChannelError` if one failed."""
        pending, self._in_flight = self._in_flight, []
        self._finish(pending)

    def _check_sender(self, bucket_bytes: int) -> None:
        if self.rank != 0:
            raise WeightChannelError(f"{self._describe()}: only rank 0 sends")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")

    def _cut(
        self, named_tensors: NamedTensors, bucket_bytes: int
    ) -> Iterator[tuple[list[tuple[str, torch.Tensor]], bool]]:
        """Consecutive runs of ``named_tensors`` of at most ``bucket_bytes`` (aligned; a
        bigger tensor alone), each with whether it is the last (known without waiting: a
        run is cut when the next tensor has come)."""
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in named_tensors:
            nbytes = _aligned(tensor.numel() * tensor.element_size())
            if bucket and size + nbytes > bucket_bytes:
                yield bucket, False
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += nbytes
        if bucket:
            yield bucket, True

    def _prepare(
        self,
        tensors: list[tuple[str, torch.Tensor]],
        slot: Any,
        copy_direct: bool = False,
    ) -> _Bucket:
        """Lay ``tensors`` out: small ones packed into bucket buffer ``slot``, direct ones as flat
        views of their own memory (``copy_direct``: copied in after the packed bytes)."""
        entries, offset = [], 0
        alone = len(tensors) == 1
        for name, tensor in tensors:
            nbytes = tensor.numel() * tensor.element_size()
            direct = nbytes > 0 and (alone or nbytes >= self.direct_bytes)
            entries.append(_Entry(name, tensor.dtype, tuple(tensor.shape), -1, nbytes, direct))
            if not direct:
                entries[-1] = _with_offset(entries[-1], offset)
                offset += _aligned(nbytes)
        packed_len = offset
        if copy_direct:
            for i, entry in enumerate(entries):
                if entry.direct:
                    entries[i] = _with_offset(entry, offset)
                    offset += _aligned(entry.nbytes)
        buffer = self._bucket_buffer(slot, offset) if offset else None
        direct_views: list[torch.Tensor] = []
        for entry, (_, tensor) in zip(entries, tensors, strict=True):
            raw = _as_bytes(tensor)
            if buffer is not None and (copy_direct or not entry.direct):
                view = buffer[entry.offset : entry.offset + entry.nbytes]
                view.copy_(raw)
                raw = view
            if entry.direct:
                direct_views.append(raw if raw.device == self.device else raw.to(self.device))
        packed = buffer[:packed_len] if buffer is not None and packed_len else None
        self.last_buckets.append([e.name for e in entries])
        return _Bucket(entries, packed, direct_views)

    def _transmit(self, bucket: _Bucket, last: bool) -> list[_Pending]:
        """Issue a prepared bucket's broadcasts (its head first, then its bytes)."""
        header = b"" if not bucket.entries else pickle.dumps([_fields(e) for e in bucket.entries])
        packed_len = 0 if bucket.packed is None else bucket.packed.numel()
        sizes = torch.tensor([len(header), packed_len, int(last)], dtype=torch.int64)
        head = torch.zeros(HEAD_BYTES, dtype=torch.uint8)
        head[:_SIZES_BYTES] = sizes.view(torch.uint8)
        inline = len(header) <= HEAD_BYTES - _SIZES_BYTES
        if inline and header:
            head[_SIZES_BYTES : _SIZES_BYTES + len(header)] = _from_bytes(header)
        pending = [self._start(head.to(self.device), "bucket head")]
        if not inline:
            pending.append(self._start(_from_bytes(header).to(self.device), "bucket header"))
        if bucket.packed is not None:
            pending.append(self._start(bucket.packed, "bucket"))
        pending += [self._start(raw, "direct tensor") for raw in bucket.direct]
        return pending

    # ------------------------------------------------------------------ receiving

    def receive(
        self, dest: Mapping[str, torch.Tensor] | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` pairs of one sync, in the sender's order; ranks ``>= 1``.

        The tensors are views into a bucket buffer (on this channel's device) that a later
        bucket overwrites: copy each one before asking for the next (as a rollout engine's
        ``update_weights`` does). ``dest`` maps names to the tensors the sync is for (e.g.
        the model's parameters): a direct tensor whose destination is contiguous, on this
        channel's device and of its dtype and shape is broadcast straight into it, and the
        pair yielded is ``(name, dest[name])`` itself, already loaded (so a consumer can
        skip copying a tensor onto itself). Ends at the sender's end marker.
        """
        if self.rank == 0:
            raise WeightChannelError(f"{self._describe()}: rank 0 sends; receive on ranks >= 1")
        self.last_buckets = []
        slot = 0
        current = self._receive_head(slot, dest or {})
        while current is not None:
            views, pending, last = current
            self._finish(pending)
            # Post the next bucket into the other buffer before handing this one out, so it
            # arrives while the consumer copies this one.
            slot = 1 - slot
            current = None if last else self._receive_head(slot, dest or {})
            yield from views

    def _receive_head(
        self, slot: int, dest: Mapping[str, torch.Tensor]
    ) -> tuple[list[tuple[str, torch.Tensor]], list[_Pending], bool] | None:
        """The next bucket's ``(name, tensor)`` pairs, its broadcasts in flight (into buffer
        ``slot`` and the destinations) and whether it is the last; ``None`` for an empty
        sync."""
        head = torch.empty(HEAD_BYTES, dtype=torch.uint8, device=self.device)
        self._finish([self._start(head, "bucket head")])
        head = head.cpu()
        header_len, packed_len, last = head[:_SIZES_BYTES].view(torch.int64).tolist()
        if header_len == 0:
            return None
        if header_len <= HEAD_BYTES - _SIZES_BYTES:
            header = head[_SIZES_BYTES : _SIZES_BYTES + header_len]
        else:
            header = torch.empty(header_len, dtype=torch.uint8, device=self.device)
            self._finish([self._start(header, "bucket header")])
        entries = [_Entry(*f) for f in pickle.loads(header.cpu().numpy().tobytes())]
        self.last_buckets.append([e.name for e in entries])
        targets = {e.name: self._destination(e, dest) for e in entries if e.direct}
        scratch = packed_len + sum(
            _aligned(e.nbytes) for e in entries if e.direct and targets[e.name] is None
        )
        buffer = self._bucket_buffer(slot, scratch)
        pending = [self._start(buffer[:packed_len], "bucket")] if packed_len else []
        views: list[tuple[str, torch.Tensor]] = []
        offset = packed_len
        for entry in entries:
            if not entry.direct:
                raw = buffer[entry.offset : entry.offset + entry.nbytes]
                views.append((entry.name, _typed(raw, entry)))
                continue
            target = targets[entry.name]
            if target is None:
                raw = buffer[offset : offset + entry.nbytes]
                offset += _aligned(entry.nbytes)
                views.append((entry.name, _typed(raw, entry)))
            else:
                raw = _as_bytes(target)
                views.append((entry.name, target))
            pending.append(self._start(raw, "direct tensor"))
        return views, pending, bool(last)

    def _destination(self, entry: _Entry, dest: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        """``dest[entry.name]`` when the entry can be broadcast straight into it."""
        target = dest.get(entry.name)
        if (
            target is None
            or target.dtype != entry.dtype
            or tuple(target.shape) != entry.shape
            or target.device != self.device
            or not target.is_contiguous()
        ):
            return None
        return target

    def close(self) -> None:
        """Leave the channel (idempotent); later sends and receives raise. A buffered send
        still in flight is abandoned."""
        pg, self._pg = self._pg, None
        self._in_flight = []
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


def _with_offset(entry: _Entry, offset: int) -> _Entry:
    return _Entry(entry.name, entry.dtype, entry.shape, offset, entry.nbytes, entry.direct)


def _fields(entry: _Entry) -> tuple[Any, ...]:
    """The entry as a plain tuple (pickles in a third of the bytes of the dataclass)."""
    return (entry.name, entry.dtype, entry.shape, entry.offset, entry.nbytes, entry.direct)


def _from_bytes(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _typed(raw: torch.Tensor, entry: _Entry) -> torch.Tensor:
    """Flat bytes ``raw`` as the entry's dtype and shape (a view)."""
    return raw.view(entry.dtype).view(entry.shape)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat uint8 view (a copy only if it is not contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


class ChannelMember:
    """One worker's membership of a :class:`WeightChannel`: none until it joins, one at a
    time, left on :meth:`close`. The base of the sender's and the receiver's side.

    ``worker`` names the worker class in errors (``"<worker>.send_weights: ..."``).
    """

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.channel: WeightChannel | None = None
        """The joined channel, or ``None``."""

    def _join_as(
        self,
        host: str,
        port: int,
        channel_rank: int,
        world_size: int,
        device: str,
        timeout_s: float,
    ) -> None:
        """Leave any channel joined before, then join the one at ``host:port`` as
        ``channel_rank`` (a rendezvous with every other member)."""
        self.close()
        self.channel = WeightChannel.join(host, port, channel_rank, world_size, timeout_s, device)

    def close(self) -> None:
        """Leave the channel, if joined."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
