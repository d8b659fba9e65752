"""The actor worker's weight-sending methods, to mix into its class.

The actor worker class lives with its engine (``hf_engines``, which hf-rollout does not
depend on). It gets the sender's worker methods (``weight_channel_address``,
``join_weight_channel``, ``send_weights``, ``close_weight_channel``) by mixing in
:class:`WeightSending`, which delegates to a :class:`~hf_rollout.weight_sync.sender.
WeightSender`: see ``hf_algos.trainers.roles.sync_actor.SyncActorWorker``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from hf_controller import Dispatch, register
from hf_rollout.weight_sync.channel import DEFAULT_TIMEOUT_S
from hf_rollout.weight_sync.sender import WeightSender


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
