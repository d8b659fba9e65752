"""The send path of weight sync: how an actor's full weights leave for the rollout.

**Pushing** (:func:`send` and :func:`send_buffered` on a joined :class:`WeightChannel`):
the sender opens the push through the handshake (:mod:`~hf_rollout.weight_sync.handshake`:
every receiver ready within ``timeout_s``, or the missing ranks are named and nothing is
sent), broadcasts the buckets of
:mod:`~hf_rollout.weight_sync.wire`, packing the next bucket while the last one is on the
wire (two reused buffers; direct tensors go from their own memory), then waits for every
receiver's report within the push's deadline. When its broadcasts fail mid-push it sets
``abort/<push>`` and names only the ranks that sent no report. :func:`send_buffered` takes
a snapshot instead: every tensor is copied into reused buffers and the push runs in a
:class:`Background` thread, so the sender is free as soon as the copy is done and later
changes of its tensors cannot reach the receivers (no torn update).

**The actor worker's side.** In the ``separate`` placement, the actor's rank 0 hosts a
:class:`WeightChannel` that the rollout ranks join, and streams the weight-sync iterator
(``iter_full_params()``) into it. Every actor rank iterates (the gather is collective under
FSDP); only rank 0 sends: :class:`WeightSender`. The actor worker class gets the worker
methods that delegate to it by mixing in
:class:`~hf_rollout.weight_sync.sending.WeightSending`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

import torch

from hf_controller.worker import master_address
from hf_rollout.weight_sync import handshake, wire
from hf_rollout.weight_sync.channel import DEFAULT_TIMEOUT_S, ChannelMember, Pending, WeightChannel
from hf_rollout.weight_sync.checksum import checksum
from hf_rollout.weight_sync.errors import (
    WeightChannelError,
    WeightPushError,
    rejected,
    who_stopped,
)
from hf_rollout.weight_sync.faults import corrupted, exit_now
from hf_rollout.weight_sync.wire import NamedTensors

__all__ = ["Background", "WeightSender", "send", "send_buffered", "wait_sent"]


def send(
    channel: WeightChannel, named_tensors: NamedTensors, bucket_bytes: int, version: int = 0
) -> int:
    """Push ``named_tensors`` as ``version`` from ``channel`` (rank 0) to every receiver.

    Waits for every receiver to be ready (at most ``timeout_s``), then streams the
    tensors in buckets of at most ``bucket_bytes``; the iterator is consumed lazily.
    Small tensors are packed into one of two alternating bucket buffers (packing the
    next bucket overlaps sending this one), direct ones go from their own memory; the
    sender holds about two buckets. Returns when every receiver reported the push
    verified (waiting first for a buffered send), with the number of tensor bytes.
    Raises :class:`WeightPushError` (ranks not ready, dead or late) or
    :class:`~hf_rollout.weight_sync.errors.WeightIntegrityError` (a receiver found a
    bucket corrupted or missing).
    """
    _begin(channel, bucket_bytes)
    buckets = wire.cut(wire.named_pairs(named_tensors), bucket_bytes)
    return _publish(
        channel, version, buckets, lambda tensors, slot: _prepare(channel, tensors, slot)
    )


def send_buffered(
    channel: WeightChannel, named_tensors: NamedTensors, bucket_bytes: int, version: int = 0
) -> int:
    """Copy ``named_tensors`` into ``channel``'s reused snapshot buffers, start pushing
    them as ``version`` in a :class:`Background` thread and return without waiting for
    the receivers; rank 0 only.

    The receivers get the tensors as they were during this call, whatever the caller
    changes afterwards. The sender holds a copy of the whole push (its buffers are kept
    for the next one). The next :func:`send`, :func:`send_buffered` or :func:`wait_sent`
    waits for this push (and raises its error). Returns the number of tensor bytes.
    """
    _begin(channel, bucket_bytes)
    cut = list(wire.cut(wire.named_pairs(named_tensors), bucket_bytes))
    buckets = [
        (_prepare(channel, tensors, ("snapshot", index), copy_direct=True), last)
        for index, (tensors, last) in enumerate(cut)
    ]
    total = sum(e.nbytes for bucket, _ in buckets for e in bucket.entries)
    channel._background = Background(
        lambda: _publish(channel, version, iter(buckets), lambda bucket, _: bucket)
    )
    return total


def wait_sent(channel: WeightChannel) -> None:
    """Wait until the push of ``channel``'s last :func:`send_buffered` is done (no-op when
    there is none); raises its error if it failed."""
    background, channel._background = channel._background, None
    if background is not None:
        background.result()


class Background:
    """A buffered push running in a thread of its own (a
    :class:`~hf_rollout.weight_sync.channel.BackgroundPush`); :meth:`result` joins it and
    raises what it raised."""

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


def _begin(channel: WeightChannel, bucket_bytes: int) -> None:
    """Check that ``channel`` may send now (rank 0, open, not broken), after the buffered
    push before this one; start the record of this push's buckets."""
    if channel.rank != 0:
        raise WeightChannelError(f"{channel._describe()}: only rank 0 sends")
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    wait_sent(channel)
    channel._check_usable()
    channel.last_buckets = []


def _publish(
    channel: WeightChannel,
    version: int,
    items: Iterator[tuple[Any, bool]],
    prepare: Callable[[Any, Any], wire.Bucket],
) -> int:
    """One push of ``version``: the handshake, the buckets (``prepare(item, slot)`` lays
    each item out in buffer ``slot``) and the receivers' reports."""
    channel.pushes += 1
    push = channel.pushes
    if channel.faults.push == push and channel.faults.late_s is not None:
        time.sleep(channel.faults.late_s)
    start = time.monotonic()
    _open_push(channel, push, version)
    deadline = time.monotonic() + channel.deadline_s
    try:
        total = _stream(channel, push, version, items, prepare, deadline)
    except WeightChannelError as error:
        raise _push_failed(channel, push, version, start, deadline, error) from error
    _close_push(channel, push, version, start, deadline)
    channel.version = version
    return total


def _open_push(channel: WeightChannel, push: int, version: int) -> None:
    """Wait until every receiver is ready for push ``push``, then let them start; a
    rank not ready within ``timeout_s`` aborts the push before any collective."""
    control = channel._control
    missing = handshake.await_ready(control, push, channel.receivers, channel.timeout_s)
    if missing:
        why = f"rank(s) {missing} not ready within {channel.timeout_s:.1f} s"
        handshake.announce_start(control, push, abort=why)
        raise WeightPushError(
            f"{channel._describe()}: push of version {version} abandoned: {why} (a rollout "
            "rank that never called receive_weights: dead, hung, or still busy with "
            "earlier calls); no tensor was sent",
            version,
            missing,
        )
    handshake.announce_start(control, push)


def _stream(
    channel: WeightChannel,
    push: int,
    version: int,
    items: Iterator[tuple[Any, bool]],
    prepare: Callable[[Any, Any], wire.Bucket],
    deadline: float,
) -> int:
    """Broadcast every bucket of the push, two in flight at most; returns the bytes."""
    in_flight: list[list[Pending]] = [[], []]
    try:
        return _stream_items(channel, push, version, items, prepare, deadline, in_flight)
    except BaseException:
        # The receivers wait for the rest of the push: the group is out of step. Keep
        # what gloo may still read or write alive.
        channel._broken = channel._broken or f"a push of version {version} was cut off"
        channel._abandoned += [p for pending in in_flight for p in pending]
        raise


def _stream_items(
    channel: WeightChannel,
    push: int,
    version: int,
    items: Iterator[tuple[Any, bool]],
    prepare: Callable[[Any, Any], wire.Bucket],
    deadline: float,
    in_flight: list[list[Pending]],
) -> int:
    """:func:`_stream`'s loop (``in_flight``: the broadcasts of its two slots)."""
    total, slot, first, index = 0, 0, 0, -1
    faults = channel.faults
    for index, (item, last) in enumerate(items):
        channel._finish(in_flight[slot], deadline)  # this slot's buffer is free again
        bucket = prepare(item, slot)
        if faults.applies(push, index, faults.corrupt_bucket):
            bucket = corrupted(bucket)
        head = wire.Head(bucket.packed_len, last, version, index, first, bucket.entries)
        if not faults.applies(push, index, faults.drop_bucket):
            in_flight[slot] = _transmit(channel, bucket, head)
        first += len(bucket.entries)
        total += sum(e.nbytes for e in bucket.entries)
        slot = 1 - slot
        if faults.applies(push, index + 1, faults.exit_after_buckets):
            channel._finish(in_flight[0] + in_flight[1], deadline)
            exit_now()
    if index < 0:  # nothing to send: an empty push
        in_flight[slot] = _transmit(
            channel, wire.Bucket([], None, []), wire.Head(0, True, version, 0, 0, [])
        )
    for pending in in_flight:
        channel._finish(pending, deadline)
    return total


def _push_failed(
    channel: WeightChannel, push: int, version: int, start: float, deadline: float, error: Exception
) -> WeightPushError:
    """The error of a push whose broadcasts failed or timed out: the ranks that did
    not report it done (given a second to do so) are named; the channel is broken."""
    handshake.announce_abort(channel._control, push, f"push of version {version} failed")
    grace = min(max(deadline - time.monotonic(), 0.0), 1.0)
    missing = handshake.await_all(channel._control, "done", push, channel.receivers, grace)
    stopped = [rank for rank in channel.receivers if rank not in missing]
    channel._broken = channel._broken or f"push of version {version} failed"
    return WeightPushError(
        f"{channel._describe()}: push of version {version} failed after "
        f"{time.monotonic() - start:.1f} s (deadline {channel.deadline_s:.1f} s); "
        f"{who_stopped(missing, stopped)}; the receivers keep their last complete "
        f"version: {error}",
        version,
        missing,
    )


def _close_push(
    channel: WeightChannel, push: int, version: int, start: float, deadline: float
) -> None:
    """Wait for every receiver's report within the deadline; raise if one is missing
    (the channel is then broken) or if one found the push corrupted."""
    control, receivers = channel._control, channel.receivers
    missing = handshake.await_all(control, "done", push, receivers, deadline - time.monotonic())
    if missing:
        channel._broken = f"push of version {version} not finished by rank(s) {missing}"
        raise WeightPushError(
            f"{channel._describe()}: push of version {version} not finished within its "
            f"deadline of {channel.deadline_s:.1f} s ({time.monotonic() - start:.1f} s "
            f"elapsed): rank(s) {missing} did not report it received; the receivers "
            "keep their last complete version",
            version,
            missing,
        )
    reports = handshake.read_reports(control, push, receivers)
    handshake.forget_push(control, push, receivers)
    if reports:
        raise rejected(channel._describe(), version, reports, channel.last_buckets)


def _prepare(
    channel: WeightChannel,
    tensors: list[tuple[str, torch.Tensor]],
    slot: Any,
    copy_direct: bool = False,
) -> wire.Bucket:
    """Lay ``tensors`` out (:func:`wire.layout`): small ones packed into bucket buffer
    ``slot``, direct ones as flat views of their own memory (``copy_direct``: copied in
    after the packed bytes); each entry carries the checksum of the bytes that go on the
    wire."""
    entries, packed_len, nbytes = wire.layout(tensors, channel.direct_bytes, copy_direct)
    buffer = channel._bucket_buffer(slot, nbytes) if nbytes else None
    direct_views: list[torch.Tensor] = []
    for i, (entry, (_, tensor)) in enumerate(zip(entries, tensors, strict=True)):
        raw = wire.as_bytes(tensor)
        if buffer is not None and (copy_direct or not entry.direct):
            view = buffer[entry.offset : entry.offset + entry.nbytes]
            view.copy_(raw)
            raw = view
        if entry.direct:
            raw = raw if raw.device == channel.device else raw.to(channel.device)
            direct_views.append(raw)
        entries[i] = replace(entry, crc=checksum(raw))
    packed = buffer[:packed_len] if buffer is not None and packed_len else None
    channel.last_buckets.append([e.name for e in entries])
    return wire.Bucket(entries, packed, direct_views)


def _transmit(channel: WeightChannel, bucket: wire.Bucket, head: wire.Head) -> list[Pending]:
    """Issue a prepared bucket's broadcasts (its head first, then its bytes)."""
    data, header = wire.encode_head(head)
    pending = [channel._start(data.to(channel.device), "bucket head")]
    if header is not None:
        pending.append(channel._start(header.to(channel.device), "bucket header"))
    if bucket.packed is not None:
        pending.append(channel._start(bucket.packed, "bucket"))
    pending += [channel._start(raw, "direct tensor") for raw in bucket.direct]
    return pending


class WeightSender(ChannelMember):
    """One actor rank's part in the weight channel: rank 0 is its sender (channel rank 0),
    the other ranks join nothing and only take part in the gather.

    ``worker`` names the worker class in errors (``"<worker>.send_weights: ..."``).
    """

    @staticmethod
    def rendezvous_address() -> tuple[str, int]:
        """A ``(host, port)`` on this node for the channel's rendezvous (ask rank 0: it hosts
        the store)."""
        return master_address()

    def join(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        device: str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        deadline_s: float | None = None,
    ) -> None:
        """Actor ``rank`` 0 joins the channel at ``host:port`` as its sender, leaving any
        channel joined before; the other ranks have nothing to join. ``deadline_s`` bounds
        each push (default ``timeout_s``)."""
        self.close()
        if rank == 0:
            self._join_as(host, port, 0, world_size, device, timeout_s, deadline_s)

    def send(
        self,
        rank: int,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        bucket_bytes: int,
        buffered: bool = False,
        version: int = 0,
    ) -> None:
        """Push ``named_tensors`` (``iter_full_params()``) as policy ``version`` into the
        channel in buckets of ``bucket_bytes``; a rank other than 0 only iterates them (the
        gather is collective). The receivers report ``version`` with what they generate.

        ``buffered``: rank 0 copies the weights into reused buffers and returns while the
        broadcasts run in the background (:func:`send_buffered`), so the actor's
        next call (e.g. ``update_actor``) need not wait for a rollout busy generating; that
        call cannot change what the rollout receives. Costs one copy of the weights on rank 0.
        """
        if rank != 0:
            for _ in named_tensors:
                pass
            return
        if self.channel is None:
            raise RuntimeError(
                f"{self.worker}.send_weights: rank 0 has no weight channel; call "
                "join_weight_channel(host, port, world_size) first"
            )
        if buffered:
            send_buffered(self.channel, named_tensors, bucket_bytes, version)
        else:
            send(self.channel, named_tensors, bucket_bytes, version)
