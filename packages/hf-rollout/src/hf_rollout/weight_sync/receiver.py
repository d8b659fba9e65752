"""The receive path of weight sync: where a rollout worker's new weights come from.

**Receiving** (:func:`receive` on a joined :class:`WeightChannel`): each receiver
sets ``ready/<push>/<rank>`` (:mod:`~hf_rollout.weight_sync.handshake`) and waits for the
sender's start, then takes the buckets of :mod:`~hf_rollout.weight_sync.wire`, posting the
next bucket's broadcasts before it verifies the last one. Each tensor's checksum is verified
on receipt; a mismatch, or a bucket index that skips one, is a
:class:`WeightIntegrityError` naming the tensors and the version, and the receiver drains
the push to its end, so the channel stays usable. After the buckets it reports
``done/<push>/<rank>`` (``ok`` or what was wrong). Over gloo, a receiver reads between
slices of its waits whether the sender abandoned the push
(:data:`~hf_rollout.weight_sync.channel.ABORT_POLL_S`).

**Atomic commit**: a receiver stages the whole push in its own buffers (reused from push to
push) and yields nothing before the last bucket arrived and every checksum matched. A push
that fails or is cut off leaves its consumer on the last complete version: never half a
push. This costs a copy of the weights on each receiver and the overlap of the consumer's
copying with the transfer (the consumer copies after the last bucket, from memory).

**The rollout worker's side.** Two paths, one per placement:

* ``hybrid``: the actor is a fused role of the same process; :func:`fused_actor_weights`
  reads its ``iter_full_params()`` (collective, so every rank takes part);
* ``separate``: a :class:`WeightReceiver` joins the actor's :class:`WeightChannel` as
  channel rank ``1 + rank`` and loads each push into the engine once it arrived whole and
  verified.

Either way the receiver knows the policy *version* its engine holds (:attr:`WeightReceiver.
version`): the one the channel delivered, or the one given with an in-process load. The
rollout worker reports it with every sample it generates.

``hf_rollout.workers.RolloutWorker`` holds one :class:`WeightReceiver`; its worker methods
(``join_weight_channel``, ``receive_weights``, ``close_weight_channel``, ``update_weights``)
delegate here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from hf_rollout.base import RolloutEngine
from hf_rollout.weight_sync import handshake, wire
from hf_rollout.weight_sync.channel import (
    DEFAULT_TIMEOUT_S,
    ChannelMember,
    Pending,
    WeightChannel,
    sender_gone,
)
from hf_rollout.weight_sync.checksum import checksum
from hf_rollout.weight_sync.errors import (
    WeightChannelError,
    WeightIntegrityError,
    WeightPushError,
)
from hf_rollout.weight_sync.faults import exit_now

__all__ = ["WeightReceiver", "fused_actor_weights", "receive", "receive_push"]


class WeightReceiver(ChannelMember):
    """One rollout rank's membership of the weight channel (none until :meth:`join`).

    ``worker`` names the worker class in errors (``"<worker>.receive_weights: ..."``).
    """

    def __init__(self, worker: str) -> None:
        super().__init__(worker)
        self.version = 0
        """Policy version of the weights the engine holds: 0 for the initial weights, then
        the version of the last push loaded whole (a failed push leaves it, and the
        engine's weights, as they were)."""

    def loaded(self, version: int | None) -> None:
        """Record an in-process load of policy ``version`` (``None``: the next version)."""
        self.version = self.version + 1 if version is None else version

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
        """Join the channel at ``host:port`` as channel rank ``1 + rank`` (rollout ``rank``),
        leaving any channel joined before. A rendezvous with the sender and the other ranks;
        ``deadline_s`` bounds each push (default ``timeout_s``)."""
        self._join_as(host, port, 1 + rank, world_size, device, timeout_s, deadline_s)

    def receive_into(self, engine: Callable[[], RolloutEngine]) -> None:
        """Load one push from the channel into the ``update_weights`` of ``engine()``
        (asked for after the channel is checked, so a worker with neither says first that
        it has no channel), then take its version.

        The channel yields nothing before the whole push arrived and verified, so a push
        that fails raises before the engine sees a tensor: the engine keeps the weights of
        :attr:`version`."""
        if self.channel is None:
            raise RuntimeError(
                f"{self.worker}.receive_weights: no weight channel; call "
                "join_weight_channel(host, port, world_size) first"
            )
        target = engine()
        stream = receive(self.channel)
        target.update_weights(stream)
        # An engine that stopped early has not pulled the push: pull it, so it is received
        # and verified (and the next push starts at its first bucket).
        for _ in stream:
            pass
        assert self.channel.version is not None
        self.version = self.channel.version


def fused_actor_weights(fused_workers: dict[str, Any] | None) -> Iterable[tuple[str, torch.Tensor]]:
    """The full weights of the ``actor`` role fused into this process
    (``create_colocated_worker_cls_fused``): its ``iter_full_params()``, collective, so every
    rank must call it. ``fused_workers`` is the worker's ``fused_workers`` (role -> object)."""
    fused = fused_workers or {}
    actor = fused.get("actor")
    if actor is None or not hasattr(actor, "iter_full_params"):
        raise ValueError(
            "update_weights() without tensors reads the fused 'actor' role, but this "
            f"worker has fused roles {sorted(fused)}; fuse the rollout with an actor "
            "(create_colocated_worker_cls_fused({'actor': ..., 'rollout': ...})) or pass "
            "the named tensors"
        )
    params: Iterable[tuple[str, torch.Tensor]] = actor.iter_full_params()
    return params


def receive(channel: WeightChannel) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of one push on ``channel``, in the sender's order; channel
    ranks ``>= 1``. Lazy: nothing happens before the first pair is asked for.

    Nothing is yielded before the whole push arrived and every checksum matched (the
    push is staged in the channel's buffers): a push that fails raises before the
    first pair, so a consumer never loads half of one. The tensors are views into the
    staging buffers (on the channel's device), valid until the next push: copy them
    (as a rollout engine's ``update_weights`` does). Afterwards ``channel.version`` is the
    push's version. Raises :class:`WeightPushError` (the sender aborted, died or missed
    the deadline; the channel is then broken unless no collective had started) or
    :class:`WeightIntegrityError` (a bucket corrupted or missing; the channel stays
    usable).
    """
    if channel.rank == 0:
        raise WeightChannelError(f"{channel._describe()}: rank 0 sends; receive on ranks >= 1")
    channel._check_usable()
    yield from receive_push(channel)


def receive_push(channel: WeightChannel) -> list[tuple[str, torch.Tensor]]:
    """:func:`receive`'s work, done at once: handshake, stage and verify one push on
    ``channel`` (a receiving rank, usable); its ``(name, tensor)`` views into the staging
    buffers."""
    channel.pushes += 1
    push = channel.pushes
    try:
        handshake.mark_ready(channel._control, push, channel.rank)
        refused = handshake.await_start(channel._control, push, channel.rank, channel.timeout_s)
    except Exception as error:  # the store lives in the sender's process
        refused = sender_gone(error)
    if refused is not None:
        raise WeightPushError(
            f"{channel._describe()}: push {push} did not start ({refused}); this rank keeps "
            f"version {channel.version}",
            None,
            [],
        )
    start = time.monotonic()
    staging = _Staging()
    channel.last_buckets = []
    try:
        _stage(channel, push, staging, start + channel.deadline_s)
    except WeightChannelError as error:
        channel._broken = channel._broken or f"push {push} cut off"
        handshake.report_done(
            channel._control,
            push,
            channel.rank,
            {"message": str(error), "names": [], "buckets": []},
        )
        raise WeightPushError(
            f"{channel._describe()}: push of version {staging.version} cut off after "
            f"{time.monotonic() - start:.1f} s (deadline {channel.deadline_s:.1f} s) with "
            f"{staging.buckets} bucket(s) received; nothing of it loaded, this rank keeps "
            f"version {channel.version}: {error}",
            staging.version,
            [channel.rank],
        ) from error
    problem = staging.problem()
    handshake.report_done(channel._control, push, channel.rank, problem)
    assert staging.version is not None
    if problem is not None:
        raise WeightIntegrityError(
            f"{channel._describe()}: push of version {staging.version} rejected, nothing of "
            f"it loaded (this rank keeps version {channel.version}): {problem['message']}",
            staging.version,
            problem["names"],
        )
    channel.version = staging.version
    return staging.views


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

    def note(self, head: wire.Head) -> None:
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


_Received = list[tuple[wire.Entry, torch.Tensor, list[Pending]]]
"""A posted bucket: each entry with its bytes and the broadcasts that fill them."""


def _stage(channel: WeightChannel, push: int, staging: _Staging, deadline: float) -> None:
    """Receive every bucket of push ``push`` into staging buffers, verifying each one
    while the next one arrives."""
    previous: _Received | None = None
    faults = channel.faults
    while True:
        head = _receive_head(channel, push, deadline)
        staging.note(head)
        channel.last_buckets.append([e.name for e in head.entries])
        current = _post_bucket(channel, head, staging.buckets)
        staging.buckets += 1
        if previous is not None:
            _settle(channel, push, previous, staging, deadline)
        previous = current
        if faults.applies(push, staging.buckets, faults.exit_after_buckets):
            exit_now()
        if head.last:
            break
    _settle(channel, push, previous, staging, deadline)


def _receive_head(channel: WeightChannel, push: int, deadline: float) -> wire.Head:
    """The next bucket's head of push ``push`` (and its header, when it did not fit)."""
    data = torch.empty(wire.HEAD_BYTES, dtype=torch.uint8, device=channel.device)
    channel._finish([channel._start(data, "bucket head")], deadline, push)
    sizes, header = wire.read_sizes(data.cpu())
    if sizes[0] and header is None:
        header = torch.empty(sizes[0], dtype=torch.uint8, device=channel.device)
        channel._finish([channel._start(header, "bucket header")], deadline, push)
    try:
        return wire.decode_head(sizes, header)
    except Exception as error:
        channel._broken = "a bucket header could not be read"
        raise WeightChannelError(f"{channel._describe()}: unreadable bucket header") from error


def _post_bucket(channel: WeightChannel, head: wire.Head, number: int) -> _Received:
    """Post the broadcasts of a bucket into staging buffer ``number``."""
    direct_bytes = sum(wire.aligned(e.nbytes) for e in head.entries if e.direct)
    buffer = channel._bucket_buffer(("stage", number), head.packed_len + direct_bytes)
    packed = [channel._start(buffer[: head.packed_len], "bucket")] if head.packed_len else []
    received = []
    offset = head.packed_len
    for entry in head.entries:
        if entry.direct:
            raw = buffer[offset : offset + entry.nbytes]
            offset += wire.aligned(entry.nbytes)
            received.append((entry, raw, [channel._start(raw, "direct tensor")]))
        else:
            received.append((entry, buffer[entry.offset : entry.offset + entry.nbytes], packed))
    return received


def _settle(
    channel: WeightChannel, push: int, received: _Received, staging: _Staging, deadline: float
) -> None:
    """Wait for a bucket's bytes, verify each tensor's checksum, stage its view."""
    for entry, raw, pending in received:
        channel._finish(pending, deadline, push)
        if checksum(raw) != entry.crc:
            staging.corrupt.append(entry.name)
        staging.views.append((entry.name, wire.typed(raw, entry)))
