"""A direct actor -> rollout weight channel: a torch.distributed group beside the default one.

The ``separate`` placement keeps the actor and the rollout in different processes. Weights
must not travel through the driver (DESIGN.md, "Two planes"), so actor rank 0 and every
rollout rank join one extra process group: channel rank 0 sends, channel ranks ``1..R``
receive. The group is built from the public constructors (``TCPStore`` +
``ProcessGroupGloo`` / ``ProcessGroupNCCL``) and used through its own collectives, so the
workers' default process groups are never touched.

A *push* is one sync of the weight-sync stream of DESIGN.md, ``(name, full tensor)`` in the
actor's order, cut into buckets of at most ``bucket_bytes``, and it carries a *version*
(the policy version of these weights; the receivers report it with every sample).

**Handshake** (:mod:`~hf_rollout.weight_sync.handshake`, through the channel's store, no
collective): each receiver sets ``ready/<push>/<rank>`` when it enters :meth:`receive`; the
sender waits for all of them (at most ``timeout_s``) before its first broadcast, and names
the ranks that did not come; after the buckets each receiver sets ``done/<push>/<rank>``
(``ok`` or what was wrong), and the sender waits for those within the push's deadline. A
push that does not finish within ``deadline_s`` (counted from the start) ends on every rank
with a :class:`WeightPushError` naming the version and the ranks that did not finish. When
the sender's broadcasts fail mid-push (a receiver died), it sets ``abort/<push>``; gloo
receivers read it between slices of their waits (:data:`ABORT_POLL_S`), stop and report,
so the sender names only the ranks that sent no report (dead or hung), and the live ones
are free within a fraction of a second instead of at the deadline.

Per bucket the sender broadcasts

1. ``head``: :data:`HEAD_BYTES` bytes: int64 ``[header_len, packed_len, last, version,
   bucket index, index of its first tensor]`` and the header, the pickled ``(name, dtype,
   shape, offset, nbytes, direct, checksum)`` of each tensor (a header too long for the head
   follows in a broadcast of its own); ``last`` says no bucket follows, and a head with
   ``header_len == 0`` is an empty push;
2. ``packed``: the bytes of the bucket's small tensors, each at an offset aligned to
   :data:`ALIGN` (left out when the bucket has none);
3. each *direct* tensor (at least ``direct_bytes``, or alone in its bucket) on its own,
   from its own memory: no packing copy on the sender.

**Checksums** (:mod:`~hf_rollout.weight_sync.checksum`): the sender takes one per tensor
(``zlib.crc32`` of its bytes on the CPU, a reduction on the device under NCCL), the receiver
verifies each on receipt. A mismatch, or a bucket index that skips one, is a
:class:`WeightIntegrityError` naming the tensors and the version; the receiver drains the
push to its end, so the channel stays usable.

**Atomic commit**: a receiver stages the whole push in its own buffers (reused from push to
push) and yields nothing before the last bucket arrived and every checksum matched. A push
that fails or is cut off leaves its consumer on the last complete version: never half a
push. This costs a copy of the weights on each receiver and the overlap of the consumer's
copying with the transfer (the consumer copies after the last bucket, from memory).

Each collective has a fixed cost (about 0.2-0.5 ms over gloo on a loaded 2-core machine),
which is why small tensors are packed and the head carries sizes, header and end marker in
one broadcast. The sender packs the next bucket while the last one is on the wire (two
reused buffers); the receiver posts the next bucket's broadcasts before it verifies the
last one.

:meth:`WeightChannel.send_buffered` takes a snapshot instead: every tensor is copied into
reused buffers and the push (handshake and broadcasts) runs in a background thread, so the
sender is free as soon as the copy is done and later changes of its tensors cannot reach the
receivers (no torn update).

Faults for tests are injected through :class:`~hf_rollout.weight_sync.faults.WeightFaults`
(a constructor argument that production code never passes).
"""

from __future__ import annotations

import datetime
import pickle
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from hf_protocol.rendezvous import gloo_device_toward, store_on
from hf_rollout.weight_sync import handshake
from hf_rollout.weight_sync.checksum import checksum
from hf_rollout.weight_sync.errors import (
    WeightChannelError,
    WeightIntegrityError,
    WeightPushError,
)
from hf_rollout.weight_sync.faults import WeightFaults, exit_now

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DIRECT_BYTES",
    "ChannelMember",
    "WeightChannel",
    "WeightChannelError",
    "WeightIntegrityError",
    "WeightPushError",
]

DEFAULT_TIMEOUT_S = 300.0
"""How long a join, or a push's handshake, waits for a peer before the channel gives up;
also the default deadline of a push's transfer."""

DIRECT_BYTES = 2 << 20
"""Tensors of at least this many bytes travel unpacked: below it, one more collective costs
more than packing and unpacking the bytes (measured over gloo on 2 cores)."""

ALIGN = 16
"""Byte alignment of each tensor in a bucket, so a slice can be viewed as any dtype."""

HEAD_BYTES = 16 << 10
"""Size of a bucket's head broadcast (sizes, end flag and, when it fits, the header)."""

ABORT_POLL_S = 0.1
"""A receiver waiting for a broadcast reads, this often, whether the sender abandoned the
push; a live receiver of a failed push so stops within this time instead of at the push's
deadline, and the sender names only the ranks that are gone."""

_SIZES = 6  # int64 [header_len, packed_len, last, version, bucket, first tensor]
_SIZES_BYTES = _SIZES * 8

_PREFIX = "hf_weight_channel"
_CONTROL = "hf_weight_push/"

NamedTensors = Iterable[tuple[str, torch.Tensor]]


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
    crc: int = 0
    """Checksum of the tensor's bytes (:func:`~hf_rollout.weight_sync.checksum.checksum`)."""


@dataclass
class _Bucket:
    """A bucket ready to go: its header, packed bytes and direct tensors (flat uint8)."""

    entries: list[_Entry]
    packed: torch.Tensor | None
    direct: list[torch.Tensor]


@dataclass(frozen=True)
class _Head:
    """What a bucket's head says."""

    packed_len: int
    last: bool
    version: int
    index: int
    first: int
    """Position of the bucket's first tensor in the push."""
    entries: list[_Entry]


@dataclass
class _Staging:
    """A receiver's push so far: the staged tensors and what was wrong."""

    version: int | None = None
    buckets: int = 0
    """Buckets received."""
    next_index: int = 0
    """Index of the bucket expected next."""
    next_tensor: int = 0
    views: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    """Indices of buckets that never came."""
    missing_tensors: list[tuple[int, int]] = field(default_factory=list)
    """``[first, end)`` positions of the tensors of each gap."""

    def problem(self) -> dict[str, Any] | None:
        """What to report in ``done`` (``None``: all verified)."""
        if not self.corrupt and not self.missing:
            return None
        parts = []
        if self.corrupt:
            parts.append(f"checksum mismatch of {', '.join(self.corrupt)}")
        if self.missing:
            gaps = ", ".join(f"tensors {a}..{b - 1}" for a, b in self.missing_tensors)
            parts.append(f"bucket(s) {self.missing} never arrived ({gaps})")
        return {"message": "; ".join(parts), "names": self.corrupt, "buckets": self.missing}

    def note(self, head: _Head) -> None:
        """Take a bucket's head: its version, and any buckets skipped before it."""
        if self.version is None:
            self.version = head.version
        if head.version != self.version or head.index < self.next_index:
            raise WeightChannelError(
                f"bucket {head.index} of version {head.version} in a push of version "
                f"{self.version} after bucket {self.next_index - 1}: the protocol is broken"
            )
        if head.index > self.next_index:
            self.missing += range(self.next_index, head.index)
            self.missing_tensors.append((self.next_tensor, head.first))
        self.next_index = head.index + 1
        self.next_tensor = head.first + len(head.entries)


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
        deadline_s: float | None = None,
        faults: WeightFaults | None = None,
    ) -> None:
        self.host, self.port = host, int(port)
        self.rank, self.world_size = rank, world_size
        self.timeout_s = timeout_s
        self.deadline_s = timeout_s if deadline_s is None else deadline_s
        """A push's transfer must finish within this many seconds of its start."""
        self.device = torch.device(device)
        self.direct_bytes = direct_bytes
        self.faults = faults or WeightFaults(push=-1)
        self._pg: Any = None
        self._store: Any = None
        self._control: Any = None  # the store's keys of the handshake
        self._broken: str | None = None  # why the collectives can no longer be trusted
        self._buffers: dict[Any, torch.Tensor] = {}
        self._background: _Background | None = None  # a buffered send's push
        self._abandoned: list[_Pending] = []  # broadcasts of a failed push, kept alive
        self.pushes = 0
        """Pushes sent or received since joining (the handshake's push numbers)."""
        self.version: int | None = None
        """Receiver: the version of the last push received whole and verified (``None``
        before the first); sender: the version of the last push sent."""
        self.last_buckets: list[list[str]] = []
        """Names per bucket of the last push sent or received (for tests and debugging)."""

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
        deadline_s: float | None = None,
        faults: WeightFaults | None = None,
    ) -> WeightChannel:
        """Join the channel at ``host:port`` as ``rank`` of ``world_size``.

        Rank 0 hosts the rendezvous store. Blocks until every member joined; raises
        :class:`WeightChannelError` naming the address and the ranks missing after
        ``timeout_s``. ``device="cuda"`` uses NCCL (tensors on the GPU), otherwise gloo.
        ``direct_bytes`` (sender) is the size from which a tensor travels unpacked.
        ``deadline_s`` (default ``timeout_s``) bounds each push's transfer, and each
        broadcast. ``faults`` is for tests only (:mod:`~hf_rollout.weight_sync.faults`).
        """
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(
                f"a weight channel needs world_size >= 2 (one sender, >= 1 receiver) and "
                f"0 <= rank < world_size; got rank={rank}, world_size={world_size}"
            )
        if direct_bytes < 1:
            raise ValueError(f"direct_bytes must be positive, got {direct_bytes}")
        channel = cls(
            host, port, rank, world_size, timeout_s, device, direct_bytes, deadline_s, faults
        )
        channel._connect()
        return channel

    def __repr__(self) -> str:
        return (
            f"WeightChannel({self.host}:{self.port}, rank {self.rank} of {self.world_size}, "
            f"{self.device.type})"
        )

    @property
    def receivers(self) -> list[int]:
        """The receivers' channel ranks."""
        return list(range(1, self.world_size))

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
            self._control = dist.PrefixStore(_CONTROL, self._store)
            self._control.set(f"joined/0/{self.rank}", b"1")
            if self.rank == 0:
                missing = handshake.await_all(
                    self._control, "joined", 0, self.receivers, self.timeout_s
                )
                if missing:
                    raise RuntimeError(f"rank(s) {missing} did not join")
            self._pg = self._process_group(dist.PrefixStore(_PREFIX, self._store))
        except Exception as error:  # c10d raises several types; say which channel failed
            raise WeightChannelError(
                f"{self._describe()}: joining failed within {self.timeout_s:.0f} s: {error}. "
                f"Every member must join at the same time; check that all {self.world_size} "
                f"ranks are alive and that {self.host}:{self.port} is reachable"
            ) from error

    def _process_group(self, store: Any) -> Any:
        """The group: gloo connects within the join's ``timeout_s``; NCCL (which connects
        at its first collective) times out after the push deadline. Every broadcast also
        carries the deadline as its own timeout (:meth:`_start`), so a hung peer cannot
        hold a push, or a failed push's clean-up, for longer."""
        if self.device.type == "cuda":
            nccl = getattr(dist, "ProcessGroupNCCL", None)
            if nccl is None:
                raise RuntimeError("this torch build has no NCCL; use device='cpu'")
            options = nccl.Options()
            options._timeout = datetime.timedelta(seconds=self.deadline_s)
            return nccl(store, self.rank, self.world_size, options)
        gloo: Any = dist.ProcessGroupGloo  # its options type is missing in torch's stubs
        options = gloo._Options()
        options._devices = [gloo_device_toward(self.host)]  # listens toward the host only
        options._timeout = datetime.timedelta(seconds=self.timeout_s)
        return gloo(store, self.rank, self.world_size, options)

    # ------------------------------------------------------------------ collectives

    def _check_usable(self) -> None:
        if self._pg is None:
            raise WeightChannelError(f"{self._describe()}: the channel is closed")
        if self._broken is not None:
            raise WeightChannelError(
                f"{self._describe()}: the channel is broken ({self._broken}); join a new "
                "channel (WeightLink.open) before the next push"
            )

    def _start(self, tensor: torch.Tensor, what: str) -> _Pending:
        """Issue a broadcast from rank 0 without waiting (gloo runs it in the background,
        in issue order)."""
        self._check_usable()
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.timeout = datetime.timedelta(seconds=self.deadline_s)
        try:
            return _Pending(self._pg.broadcast([tensor], options), tensor, what)
        except Exception as error:
            raise self._failed(what, error) from error

    def _finish(
        self, pending: list[_Pending], deadline: float | None = None, push: int | None = None
    ) -> None:
        """Wait for ``pending`` broadcasts, each at most until ``deadline`` (monotonic). A
        receiver passes its ``push``: over gloo it then waits in slices of
        :data:`ABORT_POLL_S` and stops when the sender abandons the push (see
        :func:`handshake.announce_abort`). Not under NCCL, where a wait that times out marks
        the collective failed: there the deadline ends a failed push."""
        sliced = push is not None and self.device.type != "cuda"
        for item in pending:
            try:
                if deadline is None:
                    item.work.wait()
                elif not sliced:
                    left = max(deadline - time.monotonic(), 0.001)
                    item.work.wait(datetime.timedelta(seconds=left))
                else:
                    assert push is not None
                    self._wait_unless_abandoned(item, deadline, push)
            except WeightChannelError:
                raise
            except Exception as error:
                raise self._failed(item.what, error) from error
        pending.clear()

    def _wait_unless_abandoned(self, item: _Pending, deadline: float, push: int) -> None:
        """Wait for one broadcast until ``deadline``; between slices of the wait, read
        whether the sender abandoned push ``push`` and raise if it did."""
        while True:
            left = max(deadline - time.monotonic(), 0.001)
            try:
                item.work.wait(datetime.timedelta(seconds=min(left, ABORT_POLL_S)))
                return
            except Exception:
                if item.work.is_completed():
                    # It ended after the slice ran out (or failed): a wait on a finished
                    # collective returns, or raises the collective's own error. Raising
                    # the slice's timeout here failed a push that had arrived (the soak).
                    item.work.wait()
                    return
                if left <= ABORT_POLL_S:
                    raise  # the deadline is up
            try:
                why = handshake.read_abort(self._control, push)
            except Exception as error:  # the store lives in the sender's process
                why = _sender_gone(error)
            if why is not None:
                self._broken = self._broken or f"push {push} abandoned by the sender"
                raise WeightChannelError(
                    f"{self._describe()}: the sender abandoned the push while this rank "
                    f"waited for the {item.what}: {why}"
                )

    def _failed(self, what: str, error: Exception) -> WeightChannelError:
        self._broken = self._broken or f"a broadcast of the {what} failed"
        return WeightChannelError(
            f"{self._describe()}: broadcast of the {what} failed (a peer died, left or took "
            f"longer than the deadline of {self.deadline_s:.1f} s): {error}"
        )

    def _bucket_buffer(self, slot: Any, nbytes: int) -> torch.Tensor:
        """Buffer ``slot`` with room for ``nbytes``, reused across buckets and pushes (fresh
        memory would pay its page faults on every bucket)."""
        buffer = self._buffers.get(slot)
        if buffer is None or buffer.numel() < nbytes:
            buffer = self._buffers[slot] = torch.empty(
                nbytes, dtype=torch.uint8, device=self.device
            )
        return buffer[:nbytes]

    # ------------------------------------------------------------------ sending

    def send(self, named_tensors: NamedTensors, bucket_bytes: int, version: int = 0) -> int:
        """Push ``named_tensors`` as ``version`` to every receiver; rank 0 only.

        Waits for every receiver to be ready (at most ``timeout_s``), then streams the
        tensors in buckets of at most ``bucket_bytes``; the iterator is consumed lazily.
        Small tensors are packed into one of two alternating bucket buffers (packing the
        next bucket overlaps sending this one), direct ones go from their own memory; the
        sender holds about two buckets. Returns when every receiver reported the push
        verified (waiting first for a buffered send), with the number of tensor bytes.
        Raises :class:`WeightPushError` (ranks not ready, dead or late) or
        :class:`WeightIntegrityError` (a receiver found a bucket corrupted or missing).
        """
        self._check_sender(bucket_bytes)
        self.wait_sent()
        self._check_usable()
        self.last_buckets = []
        cut = self._cut(named_tensors, bucket_bytes)
        return self._publish(version, cut, lambda tensors, slot: self._prepare(tensors, slot))

    def send_buffered(
        self, named_tensors: NamedTensors, bucket_bytes: int, version: int = 0
    ) -> int:
        """Copy ``named_tensors`` into reused snapshot buffers, start pushing them as
        ``version`` in a background thread and return without waiting for the receivers;
        rank 0 only.

        The receivers get the tensors as they were during this call, whatever the caller
        changes afterwards. The sender holds a copy of the whole push (its buffers are kept
        for the next one). The next ``send``, ``send_buffered`` or :meth:`wait_sent` waits
        for this push (and raises its error). Returns the number of tensor bytes.
        """
        self._check_sender(bucket_bytes)
        self.wait_sent()
        self._check_usable()
        self.last_buckets = []
        cut = list(self._cut(named_tensors, bucket_bytes))
        buckets = [
            (self._prepare(tensors, ("snapshot", index), copy_direct=True), last)
            for index, (tensors, last) in enumerate(cut)
        ]
        total = sum(e.nbytes for bucket, _ in buckets for e in bucket.entries)
        self._background = _Background(
            lambda: self._publish(version, iter(buckets), lambda bucket, _: bucket)
        )
        return total

    def wait_sent(self) -> None:
        """Wait until the push of the last :meth:`send_buffered` is done (no-op when there
        is none); raises its error if it failed."""
        background, self._background = self._background, None
        if background is not None:
            background.result()

    def _check_sender(self, bucket_bytes: int) -> None:
        if self.rank != 0:
            raise WeightChannelError(f"{self._describe()}: only rank 0 sends")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")

    def _publish(
        self,
        version: int,
        items: Iterator[tuple[Any, bool]],
        prepare: Callable[[Any, Any], _Bucket],
    ) -> int:
        """One push of ``version``: the handshake, the buckets (``prepare(item, slot)`` lays
        each item out in buffer ``slot``) and the receivers' reports."""
        self.pushes += 1
        push = self.pushes
        if self.faults.push == push and self.faults.late_s is not None:
            time.sleep(self.faults.late_s)
        start = time.monotonic()
        self._open_push(push, version)
        deadline = time.monotonic() + self.deadline_s
        try:
            total = self._stream(push, version, items, prepare, deadline)
        except WeightChannelError as error:
            raise self._push_failed(push, version, start, deadline, error) from error
        self._close_push(push, version, start, deadline)
        self.version = version
        return total

    def _open_push(self, push: int, version: int) -> None:
        """Wait until every receiver is ready for push ``push``, then let them start; a
        rank not ready within ``timeout_s`` aborts the push before any collective."""
        missing = handshake.await_ready(self._control, push, self.receivers, self.timeout_s)
        if missing:
            why = f"rank(s) {missing} not ready within {self.timeout_s:.1f} s"
            handshake.announce_start(self._control, push, abort=why)
            raise WeightPushError(
                f"{self._describe()}: push of version {version} abandoned: {why} (a rollout "
                "rank that never called receive_weights: dead, hung, or still busy with "
                "earlier calls); no tensor was sent",
                version,
                missing,
            )
        handshake.announce_start(self._control, push)

    def _stream(
        self,
        push: int,
        version: int,
        items: Iterator[tuple[Any, bool]],
        prepare: Callable[[Any, Any], _Bucket],
        deadline: float,
    ) -> int:
        """Broadcast every bucket of the push, two in flight at most; returns the bytes."""
        in_flight: list[list[_Pending]] = [[], []]
        try:
            return self._stream_items(push, version, items, prepare, deadline, in_flight)
        except BaseException:
            # The receivers wait for the rest of the push: the group is out of step. Keep
            # what gloo may still read or write alive.
            self._broken = self._broken or f"a push of version {version} was cut off"
            self._abandoned += [p for pending in in_flight for p in pending]
            raise

    def _stream_items(
        self,
        push: int,
        version: int,
        items: Iterator[tuple[Any, bool]],
        prepare: Callable[[Any, Any], _Bucket],
        deadline: float,
        in_flight: list[list[_Pending]],
    ) -> int:
        """:meth:`_stream`'s loop (``in_flight``: the broadcasts of its two slots)."""
        total, slot, first, index = 0, 0, 0, -1
        faults = self.faults
        for index, (item, last) in enumerate(items):
            self._finish(in_flight[slot], deadline)  # this slot's buffer is free again
            bucket = prepare(item, slot)
            if faults.applies(push, index, faults.corrupt_bucket):
                bucket = _corrupted(bucket)
            head = _Head(_packed_len(bucket), last, version, index, first, bucket.entries)
            if not faults.applies(push, index, faults.drop_bucket):
                in_flight[slot] = self._transmit(bucket, head)
            first += len(bucket.entries)
            total += sum(e.nbytes for e in bucket.entries)
            slot = 1 - slot
            if faults.applies(push, index + 1, faults.exit_after_buckets):
                self._finish(in_flight[0] + in_flight[1], deadline)
                exit_now()
        if index < 0:  # nothing to send: an empty push
            in_flight[slot] = self._transmit(
                _Bucket([], None, []), _Head(0, True, version, 0, 0, [])
            )
        for pending in in_flight:
            self._finish(pending, deadline)
        return total

    def _push_failed(
        self, push: int, version: int, start: float, deadline: float, error: Exception
    ) -> WeightPushError:
        """The error of a push whose broadcasts failed or timed out: the ranks that did
        not report it done (given a second to do so) are named; the channel is broken."""
        handshake.announce_abort(self._control, push, f"push of version {version} failed")
        grace = min(max(deadline - time.monotonic(), 0.0), 1.0)
        missing = handshake.await_all(self._control, "done", push, self.receivers, grace)
        stopped = [rank for rank in self.receivers if rank not in missing]
        self._broken = self._broken or f"push of version {version} failed"
        return WeightPushError(
            f"{self._describe()}: push of version {version} failed after "
            f"{time.monotonic() - start:.1f} s (deadline {self.deadline_s:.1f} s); "
            f"{_who_stopped(missing, stopped)}; the receivers keep their last complete "
            f"version: {error}",
            version,
            missing,
        )

    def _close_push(self, push: int, version: int, start: float, deadline: float) -> None:
        """Wait for every receiver's report within the deadline; raise if one is missing
        (the channel is then broken) or if one found the push corrupted."""
        missing = handshake.await_all(
            self._control, "done", push, self.receivers, deadline - time.monotonic()
        )
        if missing:
            self._broken = f"push of version {version} not finished by rank(s) {missing}"
            raise WeightPushError(
                f"{self._describe()}: push of version {version} not finished within its "
                f"deadline of {self.deadline_s:.1f} s ({time.monotonic() - start:.1f} s "
                f"elapsed): rank(s) {missing} did not report it received; the receivers "
                "keep their last complete version",
                version,
                missing,
            )
        reports = handshake.read_reports(self._control, push, self.receivers)
        handshake.forget_push(self._control, push, self.receivers)
        if reports:
            raise self._rejected(version, reports)

    def _rejected(self, version: int, reports: dict[int, dict[str, Any]]) -> WeightIntegrityError:
        """The sender's error for a push that receivers found corrupted or incomplete; the
        tensors of missing buckets are named from this push's buckets."""
        names: list[str] = []
        lines = []
        for rank, problem in sorted(reports.items()):
            lost = [n for b in problem["buckets"] for n in self.last_buckets[b]]
            names += [n for n in [*problem["names"], *lost] if n not in names]
            detail = f": tensors {', '.join(lost)} lost" if lost else ""
            lines.append(f"rank {rank}: {problem['message']}{detail}")
        return WeightIntegrityError(
            f"{self._describe()}: push of version {version} rejected, nothing of it loaded "
            f"(the receivers keep their last complete version): {'; '.join(lines)}",
            version,
            names,
        )

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
        """Lay ``tensors`` out: small ones packed into bucket buffer ``slot``, direct ones as
        flat views of their own memory (``copy_direct``: copied in after the packed bytes);
        each entry carries the checksum of the bytes that go on the wire."""
        entries, offset = [], 0
        alone = len(tensors) == 1
        for name, tensor in tensors:
            nbytes = tensor.numel() * tensor.element_size()
            direct = nbytes > 0 and (alone or nbytes >= self.direct_bytes)
            entries.append(_Entry(name, tensor.dtype, tuple(tensor.shape), -1, nbytes, direct))
            if not direct:
                entries[-1] = replace(entries[-1], offset=offset)
                offset += _aligned(nbytes)
        packed_len = offset
        if copy_direct:
            for i, entry in enumerate(entries):
                if entry.direct:
                    entries[i] = replace(entry, offset=offset)
                    offset += _aligned(entry.nbytes)
        buffer = self._bucket_buffer(slot, offset) if offset else None
        direct_views: list[torch.Tensor] = []
        for i, (entry, (_, tensor)) in enumerate(zip(entries, tensors, strict=True)):
            raw = _as_bytes(tensor)
            if buffer is not None and (copy_direct or not entry.direct):
                view = buffer[entry.offset : entry.offset + entry.nbytes]
                view.copy_(raw)
                raw = view
            if entry.direct:
                raw = raw if raw.device == self.device else raw.to(self.device)
                direct_views.append(raw)
            entries[i] = replace(entry, crc=checksum(raw))
        packed = buffer[:packed_len] if buffer is not None and packed_len else None
        self.last_buckets.append([e.name for e in entries])
        return _Bucket(entries, packed, direct_views)

    def _transmit(self, bucket: _Bucket, head: _Head) -> list[_Pending]:
        """Issue a prepared bucket's broadcasts (its head first, then its bytes)."""
        header = b"" if not bucket.entries else pickle.dumps([_fields(e) for e in bucket.entries])
        sizes = [len(header), head.packed_len, int(head.last), head.version, head.index]
        sizes.append(head.first)
        data = torch.zeros(HEAD_BYTES, dtype=torch.uint8)
        data[:_SIZES_BYTES] = torch.tensor(sizes, dtype=torch.int64).view(torch.uint8)
        inline = len(header) <= HEAD_BYTES - _SIZES_BYTES
        if inline and header:
            data[_SIZES_BYTES : _SIZES_BYTES + len(header)] = _from_bytes(header)
        pending = [self._start(data.to(self.device), "bucket head")]
        if not inline:
            pending.append(self._start(_from_bytes(header).to(self.device), "bucket header"))
        if bucket.packed is not None:
            pending.append(self._start(bucket.packed, "bucket"))
        pending += [self._start(raw, "direct tensor") for raw in bucket.direct]
        return pending

    # ------------------------------------------------------------------ receiving

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` pairs of one push, in the sender's order; ranks ``>= 1``.

        Nothing is yielded before the whole push arrived and every checksum matched (the
        push is staged in this channel's buffers): a push that fails raises before the
        first pair, so a consumer never loads half of one. The tensors are views into the
        staging buffers (on this channel's device), valid until the next push: copy them
        (as a rollout engine's ``update_weights`` does). Afterwards :attr:`version` is the
        push's version. Raises :class:`WeightPushError` (the sender aborted, died or missed
        the deadline; the channel is then broken unless no collective had started) or
        :class:`WeightIntegrityError` (a bucket corrupted or missing; the channel stays
        usable).
        """
        if self.rank == 0:
            raise WeightChannelError(f"{self._describe()}: rank 0 sends; receive on ranks >= 1")
        self._check_usable()
        yield from self._receive_push()

    def _receive_push(self) -> list[tuple[str, torch.Tensor]]:
        """Handshake, stage and verify one push; its ``(name, tensor)`` views."""
        self.pushes += 1
        push = self.pushes
        try:
            handshake.mark_ready(self._control, push, self.rank)
            refused = handshake.await_start(self._control, push, self.rank, self.timeout_s)
        except Exception as error:  # the store lives in the sender's process
            refused = _sender_gone(error)
        if refused is not None:
            raise WeightPushError(
                f"{self._describe()}: push {push} did not start ({refused}); this rank keeps "
                f"version {self.version}",
                None,
                [],
            )
        start = time.monotonic()
        staging = _Staging()
        self.last_buckets = []
        try:
            self._stage(push, staging, start + self.deadline_s)
        except WeightChannelError as error:
            self._broken = self._broken or f"push {push} cut off"
            handshake.report_done(
                self._control, push, self.rank, {"message": str(error), "names": [], "buckets": []}
            )
            raise WeightPushError(
                f"{self._describe()}: push of version {staging.version} cut off after "
                f"{time.monotonic() - start:.1f} s (deadline {self.deadline_s:.1f} s) with "
                f"{staging.buckets} bucket(s) received; nothing of it loaded, this rank keeps "
                f"version {self.version}: {error}",
                staging.version,
                [self.rank],
            ) from error
        problem = staging.problem()
        handshake.report_done(self._control, push, self.rank, problem)
        assert staging.version is not None
        if problem is not None:
            raise WeightIntegrityError(
                f"{self._describe()}: push of version {staging.version} rejected, nothing of "
                f"it loaded (this rank keeps version {self.version}): {problem['message']}",
                staging.version,
                problem["names"],
            )
        self.version = staging.version
        return staging.views

    def _stage(self, push: int, staging: _Staging, deadline: float) -> None:
        """Receive every bucket of push ``push`` into staging buffers, verifying each one
        while the next one arrives."""
        previous: list[tuple[_Entry, torch.Tensor, list[_Pending]]] | None = None
        while True:
            head = self._receive_head(push, deadline)
            staging.note(head)
            self.last_buckets.append([e.name for e in head.entries])
            current = self._post_bucket(head, staging.buckets)
            staging.buckets += 1
            if previous is not None:
                self._settle(push, previous, staging, deadline)
            previous = current
            if self.faults.applies(push, staging.buckets, self.faults.exit_after_buckets):
                exit_now()
            if head.last:
                break
        self._settle(push, previous, staging, deadline)

    def _receive_head(self, push: int, deadline: float) -> _Head:
        """The next bucket's head of push ``push`` (and its header, when it did not fit)."""
        data = torch.empty(HEAD_BYTES, dtype=torch.uint8, device=self.device)
        self._finish([self._start(data, "bucket head")], deadline, push)
        data = data.cpu()
        sizes = data[:_SIZES_BYTES].view(torch.int64).tolist()
        header_len, packed_len, last, version, index, first = sizes
        if header_len == 0:
            return _Head(0, True, version, index, first, [])
        if header_len <= HEAD_BYTES - _SIZES_BYTES:
            header = data[_SIZES_BYTES : _SIZES_BYTES + header_len]
        else:
            header = torch.empty(header_len, dtype=torch.uint8, device=self.device)
            self._finish([self._start(header, "bucket header")], deadline, push)
        try:
            fields = pickle.loads(header.cpu().numpy().tobytes())
        except Exception as error:
            self._broken = "a bucket header could not be read"
            raise WeightChannelError(f"{self._describe()}: unreadable bucket header") from error
        return _Head(packed_len, bool(last), version, index, first, [_Entry(*f) for f in fields])

    def _post_bucket(
        self, head: _Head, number: int
    ) -> list[tuple[_Entry, torch.Tensor, list[_Pending]]]:
        """Post the broadcasts of a bucket into staging buffer ``number``; each entry with
        its bytes and the broadcasts that fill them."""
        scratch = head.packed_len + sum(_aligned(e.nbytes) for e in head.entries if e.direct)
        buffer = self._bucket_buffer(("stage", number), scratch)
        packed = [self._start(buffer[: head.packed_len], "bucket")] if head.packed_len else []
        received = []
        offset = head.packed_len
        for entry in head.entries:
            if entry.direct:
                raw = buffer[offset : offset + entry.nbytes]
                offset += _aligned(entry.nbytes)
                received.append((entry, raw, [self._start(raw, "direct tensor")]))
            else:
                received.append((entry, buffer[entry.offset : entry.offset + entry.nbytes], packed))
        return received

    def _settle(
        self,
        push: int,
        received: list[tuple[_Entry, torch.Tensor, list[_Pending]]],
        staging: _Staging,
        deadline: float,
    ) -> None:
        """Wait for a bucket's bytes, verify each tensor's checksum, stage its view."""
        for entry, raw, pending in received:
            self._finish(pending, deadline, push)
            if checksum(raw) != entry.crc:
                staging.corrupt.append(entry.name)
            staging.views.append((entry.name, _typed(raw, entry)))

    def close(self) -> None:
        """Leave the channel (idempotent); later sends and receives raise. A buffered push
        still in flight is abandoned."""
        pg, self._pg = self._pg, None
        self._background = None
        if pg is not None:
            shutdown = getattr(pg, "shutdown", None)
            if callable(shutdown):
                shutdown()
        self._store = self._control = None
        self._buffers.clear()


@dataclass
class _Pending:
    """A broadcast in flight, and the tensor it reads or writes (kept alive until done)."""

    work: Any
    tensor: torch.Tensor
    what: str


class _Background:
    """A buffered push running in a thread of its own; :meth:`result` joins it and raises
    what it raised."""

    def __init__(self, push: Callable[[], int]) -> None:
        self._push = push
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="weight-push", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._push()
        except BaseException as error:  # handed to the caller of result()
            self._error = error

    def result(self) -> None:
        """Wait for the push; raise its error, if any."""
        self._thread.join()
        if self._error is not None:
            raise self._error


def _sender_gone(error: Exception) -> str:
    """Why a receiver cannot go on when the sender's store (in its process) does not answer."""
    return f"the sender's store is unreachable, the sender is gone: {error}"


def _who_stopped(missing: list[int], stopped: list[int]) -> str:
    """Which receivers of a failed push are gone (no report) and which heard the abort."""
    parts = [f"rank(s) {missing} did not finish it (no report: dead or hung)"] if missing else []
    if stopped:
        parts.append(f"rank(s) {stopped} stopped with it" if missing else "every rank stopped")
    return ", ".join(parts)


def _aligned(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def _packed_len(bucket: _Bucket) -> int:
    return 0 if bucket.packed is None else bucket.packed.numel()


def _corrupted(bucket: _Bucket) -> _Bucket:
    """``bucket`` with one byte flipped on the wire (fault injection): in a copy, so the
    sender's own tensors stay intact."""
    if bucket.packed is not None and bucket.packed.numel():
        packed = bucket.packed.clone()
        packed[0] ^= 0xFF
        return _Bucket(bucket.entries, packed, bucket.direct)
    direct = [t.clone() for t in bucket.direct]
    if direct:
        direct[0][0] ^= 0xFF
    return _Bucket(bucket.entries, None, direct)


def _fields(entry: _Entry) -> tuple[Any, ...]:
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
        deadline_s: float | None = None,
    ) -> None:
        """Leave any channel joined before, then join the one at ``host:port`` as
        ``channel_rank`` (a rendezvous with every other member)."""
        self.close()
        self.channel = WeightChannel.join(
            host, port, channel_rank, world_size, timeout_s, device, deadline_s=deadline_s
        )

    def close(self) -> None:
        """Leave the channel, if joined."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
