"""The weight channel: a torch.distributed group beside the default one, connecting the
actor's sender to the rollout's receivers.

The ``separate`` placement keeps the actor and the rollout in different processes. Weights
must not travel through the driver (DESIGN.md, "Two planes"), so actor rank 0 and every
rollout rank join one extra process group: channel rank 0 sends, channel ranks ``1..R``
receive. The group is built from the public constructors (``TCPStore`` +
``ProcessGroupGloo`` / ``ProcessGroupNCCL``) and used through its own collectives, so the
workers' default process groups are never touched.

This module holds the connection: :class:`WeightChannel` joins (a rendezvous through the
store, which also carries the push handshake of :mod:`~hf_rollout.weight_sync.handshake`),
issues and waits for broadcasts within a push's deadline, keeps the reused bucket buffers
and knows when it is broken; and :class:`ChannelMember`, a worker's membership of one. What
travels is laid out by :mod:`~hf_rollout.weight_sync.wire`. Pushes are not this module's:
:mod:`~hf_rollout.weight_sync.sender` sends them (``sender.send(channel, ...)``,
``sender.send_buffered``, ``sender.wait_sent``) and
:mod:`~hf_rollout.weight_sync.receiver` receives, stages and verifies them
(``receiver.receive(channel)``); both build on this module, which imports neither.

Faults for tests are injected through :class:`~hf_rollout.weight_sync.faults.WeightFaults`
(a constructor argument that production code never passes).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hf_protocol.rendezvous import gloo_device_toward, store_on
from hf_rollout.weight_sync import handshake
from hf_rollout.weight_sync.errors import WeightChannelError
from hf_rollout.weight_sync.faults import WeightFaults
from hf_rollout.weight_sync.wire import DIRECT_BYTES

__all__ = [
    "ABORT_POLL_S",
    "DEFAULT_TIMEOUT_S",
    "BackgroundPush",
    "ChannelMember",
    "Pending",
    "WeightChannel",
    "sender_gone",
]

DEFAULT_TIMEOUT_S = 300.0
"""How long a join, or a push's handshake, waits for a peer before the channel gives up;
also the default deadline of a push's transfer."""

ABORT_POLL_S = 0.1
"""A receiver waiting for a broadcast reads, this often, whether the sender abandoned the
push; a live receiver of a failed push so stops within this time instead of at the push's
deadline, and the sender names only the ranks that are gone."""

_PREFIX = "hf_weight_channel"
_CONTROL = "hf_weight_push/"


class BackgroundPush(Protocol):
    """A buffered push still running (``sender.send_buffered`` starts one, the next send
    or ``sender.wait_sent`` waits for it); the channel only keeps it, and forgets it on
    :meth:`WeightChannel.close`."""

    def result(self) -> None:
        """Wait for the push; raise its error, if any."""


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
        self._background: BackgroundPush | None = None  # a buffered send's push
        self._abandoned: list[Pending] = []  # broadcasts of a failed push, kept alive
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

    def _start(self, tensor: torch.Tensor, what: str) -> Pending:
        """Issue a broadcast from rank 0 without waiting (gloo runs it in the background,
        in issue order)."""
        self._check_usable()
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.timeout = datetime.timedelta(seconds=self.deadline_s)
        try:
            return Pending(self._pg.broadcast([tensor], options), tensor, what)
        except Exception as error:
            raise self._failed(what, error) from error

    def _finish(
        self, pending: list[Pending], deadline: float | None = None, push: int | None = None
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

    def _wait_unless_abandoned(self, item: Pending, deadline: float, push: int) -> None:
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
                why = sender_gone(error)
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

    def close(self) -> None:
        """Leave the channel (idempotent); later sends and receives raise. A buffered push
        still in flight is abandoned (forgotten: its broadcasts fail)."""
        pg, self._pg = self._pg, None
        self._background = None
        if pg is not None:
            shutdown = getattr(pg, "shutdown", None)
            if callable(shutdown):
                shutdown()
        self._store = self._control = None
        self._buffers.clear()


@dataclass
class Pending:
    """A broadcast in flight, and the tensor it reads or writes (kept alive until done)."""

    work: Any
    tensor: torch.Tensor
    what: str


def sender_gone(error: Exception) -> str:
    """Why a receiver cannot go on when the sender's store (in its process) does not answer."""
    return f"the sender's store is unreachable, the sender is gone: {error}"


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
