"""The training side of weight sync: how an actor's full weights leave for the rollout.

In the ``separate`` placement, the actor's rank 0 hosts a :class:`WeightChannel` that the
rollout ranks join, and streams the weight-sync iterator (``iter_full_params()``) into it.
Every actor rank iterates (the gather is collective under FSDP); only rank 0 sends.

The actor worker class lives with its engine (``hf_engines``, which hf-rollout does not
depend on). It gets the sender's worker methods (``weight_channel_address``,
``join_weight_channel``, ``send_weights``, ``close_weight_channel``) by mixing in
:class:`WeightSending`, which delegates to a :class:`WeightSender`: see
``hf_algos.trainers.sync_actor.SyncActorWorker``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from hf_controller import Dispatch, register
from hf_controller.worker import master_address
from hf_rollout.weight_sync.channel import DEFAULT_TIMEOUT_S, ChannelMember

__all__ = ["WeightSender", "WeightSending"]


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
        broadcasts run in the background (:meth:`WeightChannel.send_buffered`), so the actor's
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
            self.channel.send_buffered(named_tensors, bucket_bytes, version)
        else:
            self.channel.send(named_tensors, bucket_bytes, version)


class WeightSending:
    """The weight-sending methods of an actor worker, to mix into a
    :class:`~hf_controller.Worker` subclass that has ``iter_full_params()`` (its full weights
    as ``(name, tensor)`` pairs, collective across its ranks).

    In the ``separate`` placement, rank 0 hosts the :class:`WeightChannel` that the rollout
    ranks join; :meth:`send_weights` streams the weights into it. Every rank takes part in
    the iteration (it is collective under FSDP); only rank 0 sends. The methods delegate to
    a :class:`WeightSender`, made on first use.
    """

    rank: int
    _weight_sender: WeightSender | None = None

    if TYPE_CHECKING:  # provided by the worker class this is mixed into

        def iter_full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
            """The worker's full weights."""
            ...

    @property
    def _sender(self) -> WeightSender:
        """This rank's side of the weight channel (made on first use)."""
        if self._weight_sender is None:
            self._weight_sender = WeightSender(type(self).__name__)
        return self._weight_sender

    @register(Dispatch.RANK_ZERO)
    def weight_channel_address(self) -> tuple[str, int]:
        """A ``(host, port)`` on rank 0's node for the weight channel's rendezvous."""
        return WeightSender.rendezvous_address()

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_channel(
        self,
        host: str,
        port: int,
        world_size: int,
        device: str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        deadline_s: float | None = None,
    ) -> None:
        """Rank 0 joins the weight channel at ``host:port`` as its sender (channel rank 0);
        the other ranks have nothing to join. Issued together with the rollout's join."""
        self._sender.join(host, port, self.rank, world_size, device, timeout_s, deadline_s)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def send_weights(self, bucket_bytes: int, buffered: bool = False, version: int = 0) -> None:
        """Push ``iter_full_params()`` as policy ``version`` into the channel in buckets of
        ``bucket_bytes``.

        Every rank iterates (the gather is collective); rank 0 sends. Issued together with
        the rollout's ``receive_weights``. ``buffered``: rank 0 returns once it has copied
        the weights (see :meth:`WeightSender.send`).
        """
        self._sender.send(self.rank, self.iter_full_params(), bucket_bytes, buffered, version)

    @register(Dispatch.ONE_TO_ALL)
    def close_weight_channel(self) -> None:
        """Leave the weight channel, if joined."""
        self._sender.close()
