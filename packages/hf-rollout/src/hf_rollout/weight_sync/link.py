"""The driver's side of weight sync: one :class:`WeightLink` pairs an actor group with a
rollout group, opens the channel between them, pushes weights and closes it.

* ``fused`` (the ``hybrid`` placement): the rollout reads the actor fused into its own
  processes (``rollout.update_weights()``); nothing to open.
* otherwise (``separate``): :meth:`WeightLink.open` has actor rank 0 and every rollout rank
  join one :class:`~hf_rollout.WeightChannel` (a rendezvous: both joins are issued, then
  waited for together); a push issues the actor's ``send_weights`` and the rollout's
  ``receive_weights`` together, non-blocking, and :meth:`WeightPush.wait` waits for both.
  The driver only issues calls: no tensor passes through it or Ray's object store.

Every push carries a policy version (``start_push(version=...)``, by default one more than
the last): the channel delivers it with the weights and the rollout reports it with every
sample it generates (``rollout_policy_version``). A push that fails raises from
:meth:`WeightPush.wait` and leaves the rollout on its last complete version (see
:mod:`~hf_rollout.weight_sync.channel`); the channel is then broken, and :meth:`WeightLink.
reopen` joins a new one.

*When* to push is the algorithm's choice (every step, or on a schedule ahead of the trainer:
``hf_algos.trainers.async_rollout.pipeline``); this module only knows how.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from hf_controller import ResultWaiter, wait_together
from hf_rollout.weight_sync.channel import DEFAULT_TIMEOUT_S
from hf_rollout.weight_sync.wire import NamedTensors

__all__ = ["WeightLink", "WeightPush", "WeightReceiverGroup", "WeightSenderGroup"]


class _ChannelMember(ResultWaiter, Protocol):
    """What both sides' groups offer: joining and leaving the channel, and waiting on their
    handles."""

    def join_weight_channel(
        self,
        host: str,
        port: int,
        world_size: int,
        device: str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        deadline_s: float | None = None,
    ) -> list[Any]:
        """Join the weight channel at ``host:port`` (waiting at most ``timeout_s`` for every
        member; each push then bounded by ``deadline_s``): on the sender's side actor rank 0
        as channel rank 0, on the receivers' every rollout rank ``r`` as channel rank
        ``1 + r``; non-blocking: one handle per rank."""
        ...

    def close_weight_channel(self) -> list[None]:
        """Leave the weight channel, every rank."""
        ...


class WeightSenderGroup(_ChannelMember, Protocol):
    """An actor group whose workers send their weights (they compose a
    :class:`~hf_rollout.weight_sync.sender.WeightSender`)."""

    def weight_channel_address(self) -> tuple[str, int]:
        """``(host, port)`` on rank 0's node for the weight channel (rank 0 only)."""
        ...

    def send_weights(
        self, bucket_bytes: int, buffered: bool = False, version: int = 0
    ) -> list[Any]:
        """Push the full weights as policy ``version`` into the channel; non-blocking: one
        handle per rank. ``buffered``: rank 0 returns once it has copied them (the
        broadcasts go on)."""
        ...


class WeightReceiverGroup(_ChannelMember, Protocol):
    """A rollout group whose workers receive weights (``hf_rollout.workers.RolloutWorker``)."""

    @property
    def world_size(self) -> int:
        """Number of rollout ranks."""
        ...

    def update_weights(
        self, named_tensors: NamedTensors | None = None, version: int | None = None
    ) -> list[None]:
        """Load full weights as policy ``version``; with no tensors, from the fused actor
        in the same process."""
        ...

    def receive_weights(self) -> list[Any]:
        """Load one sync from the weight channel; non-blocking: one handle per rank."""
        ...


@dataclass
class WeightPush:
    """A push in flight: the actor's send and the rollout's receive (nothing when fused)."""

    calls: list[tuple[str, ResultWaiter, list[Any]]] = field(default_factory=list)
    """``(method, group, handles)`` of each side's call."""

    def wait(self) -> None:
        """Wait for both sides; a failure on any rank raises at once, named by its group."""
        calls, self.calls = self.calls, []
        if calls:
            wait_together(*calls)


class WeightLink:
    """Weight sync from ``actor`` to ``rollout`` (see the module docstring).

    ``fused``: the rollout shares the actor's processes. ``bucket_bytes``, ``device``
    (``cuda`` uses NCCL), ``timeout_s`` (join and handshake) and ``deadline_s`` (each push's
    transfer; default ``timeout_s``) are the channel's, in the separate placement.
    """

    def __init__(
        self,
        actor: WeightSenderGroup,
        rollout: WeightReceiverGroup,
        fused: bool,
        bucket_bytes: int = 64 << 20,
        device: str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        deadline_s: float | None = None,
    ) -> None:
        self.actor = actor
        self.rollout = rollout
        self.fused = fused
        self.bucket_bytes = bucket_bytes
        """Bucket size of the weight channel, in bytes."""
        self.device = device
        """Where the channel's buffers live."""
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self.is_open = False
        """The channel is open (separate placement): :meth:`open` ran, :meth:`close` not."""
        self.version = 0
        """The policy version of the last push started (0: none yet, initial weights)."""

    @property
    def ready(self) -> bool:
        """Whether a push can run now: fused, or the channel is open."""
        return self.fused or self.is_open

    def open(self) -> None:
        """Open the channel: actor rank 0 and every rollout rank join it (no-op when fused).
        Both groups' models must be built (``init_model``)."""
        if self.fused:
            return
        host, port = self.actor.weight_channel_address()
        world_size = 1 + self.rollout.world_size  # actor rank 0 + every rollout rank
        args = (host, port, world_size, self.device, self.timeout_s, self.deadline_s)
        # A rendezvous: both joins must be in flight before either can finish.
        wait_together(
            ("join_weight_channel", self.actor, self.actor.join_weight_channel(*args)),
            ("join_weight_channel", self.rollout, self.rollout.join_weight_channel(*args)),
        )
        self.is_open = True

    def reopen(self) -> None:
        """Leave the channel and join a new one (after a push failed and broke it); the
        rollout keeps the weights and the version it holds."""
        self.close()
        self.open()

    def start_push(self, buffered: bool = False, version: int | None = None) -> WeightPush:
        """Start loading the actor's current weights into the rollout as policy ``version``
        (default: one more than the last push); wait on the result.

        Fused: done in process before this returns. Separate: the send and the receive are
        issued together, non-blocking; the rollout loads after the calls already queued on
        it. ``buffered``: the actor snapshots its weights and is free for its next call
        while the rollout still receives (see ``WeightSender.send``).
        """
        version = self.version + 1 if version is None else version
        if self.fused:
            # reads the fused actor in-process, every rank
            self.rollout.update_weights(version=version)
            self.version = version
            return WeightPush()
        if not self.is_open:
            raise RuntimeError(
                "WeightLink.start_push: the weight channel is not open; call open() first "
                "(after both groups' init_model)"
            )
        send = self.actor.send_weights(self.bucket_bytes, buffered=buffered, version=version)
        self.version = version
        return WeightPush(
            [
                ("send_weights", self.actor, send),
                ("receive_weights", self.rollout, self.rollout.receive_weights()),
            ]
        )

    def push(self, version: int | None = None) -> None:
        """Load the actor's current weights into the rollout as policy ``version`` (default:
        one more than the last push), waiting until it holds them."""
        self.start_push(version=version).wait()

    def close(self) -> None:
        """Leave the channel on both sides, best effort (for teardown); idempotent."""
        if not self.is_open:
            return
        self.is_open = False
        for group in (self.actor, self.rollout):
            with contextlib.suppress(Exception):  # best effort at teardown
                group.close_weight_channel()
