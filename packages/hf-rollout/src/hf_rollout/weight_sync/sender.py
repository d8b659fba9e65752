"""The training side of weight sync: how an actor's full weights leave for the rollout.

In the ``separate`` placement, the actor's rank 0 hosts a :class:`WeightChannel` that the
rollout ranks join, and streams the weight-sync iterator (``iter_full_params()``) into it.
Every actor rank iterates (the gather is collective under FSDP); only rank 0 sends.

The actor worker class lives with its engine (``hf_engines``, which hf-rollout does not
depend on), so it composes a :class:`WeightSender` and its worker methods
(``weight_channel_address``, ``join_weight_channel``, ``send_weights``,
``close_weight_channel``) delegate here: see ``hf_algos.trainers.sync_actor.SyncActorWorker``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hf_controller.worker import master_address
from hf_rollout.weight_sync.channel import DEFAULT_TIMEOUT_S, WeightChannel

__all__ = ["WeightSender"]


class WeightSender:
    """One actor rank's part in the weight channel: rank 0 is its sender (channel rank 0),
    the other ranks join nothing and only take part in the gather.

    ``worker`` names the worker class in errors (``"<worker>.send_weights: ..."``).
    """

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.channel: WeightChannel | None = None
        """Rank 0's joined channel, or ``None``."""

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
    ) -> None:
        """Actor ``rank`` 0 joins the channel at ``host:port`` as its sender, leaving any
        channel joined before; the other ranks have nothing to join."""
        self.close()
        if rank == 0:
            self.channel = WeightChannel.join(host, port, 0, world_size, timeout_s, device)

    def send(
        self,
        rank: int,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        bucket_bytes: int,
        buffered: bool = False,
    ) -> None:
        """Stream ``named_tensors`` (``iter_full_params()``) into the channel in buckets of
        ``bucket_bytes``; a rank other than 0 only iterates them (the gather is collective).

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
            self.channel.send_buffered(named_tensors, bucket_bytes)
        else:
            self.channel.send(named_tensors, bucket_bytes)

    def close(self) -> None:
        """Leave the channel, if joined."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
