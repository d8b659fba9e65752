"""``SyncActorWorker``: the trainers' actor role, an ``hf_engines`` actor that also sends its
weights to the rollout (:mod:`hf_rollout.weight_sync`)."""

from __future__ import annotations

from hf_controller import Dispatch, register
from hf_engines.workers import ActorWorker
from hf_rollout.weight_sync import DEFAULT_TIMEOUT_S, WeightSender

__all__ = ["SyncActorWorker"]


class SyncActorWorker(ActorWorker):
    """An :class:`~hf_engines.workers.ActorWorker` that can also send its full weights.

    In the ``separate`` placement, rank 0 hosts a :class:`~hf_rollout.WeightChannel` that
    the rollout ranks join; :meth:`send_weights` streams the weight-sync iterator into it.
    Every rank takes part in the iteration (it is collective under FSDP); only rank 0 sends.
    The methods delegate to a :class:`~hf_rollout.weight_sync.WeightSender`.
    """

    _weight_sender: WeightSender | None = None

    @property
    def _sender(self) -> WeightSender:
        """This rank's side of the weight channel (made on first use)."""
        if self._weight_sender is None:
            self._weight_sender = WeightSender("SyncActorWorker")
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
    ) -> None:
        """Rank 0 joins the weight channel at ``host:port`` as its sender (channel rank 0);
        the other ranks have nothing to join. Issued together with the rollout's join."""
        self._sender.join(host, port, self.rank, world_size, device, timeout_s)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def send_weights(self, bucket_bytes: int, buffered: bool = False) -> None:
        """Stream ``iter_full_params()`` into the channel in buckets of ``bucket_bytes``.

        Every rank iterates (the gather is collective); rank 0 sends. Issued together with
        the rollout's ``receive_weights``. ``buffered``: rank 0 returns once it has copied
        the weights (see :meth:`~hf_rollout.weight_sync.WeightSender.send`).
        """
        self._sender.send(self.rank, self.iter_full_params(), bucket_bytes, buffered)

    @register(Dispatch.ONE_TO_ALL)
    def close_weight_channel(self) -> None:
        """Leave the weight channel, if joined."""
        self._sender.close()
