"""``SyncActorWorker``: the trainers' actor role, an ``hf_engines`` actor that also sends its
weights to the rollout (:mod:`hf_rollout.weight_sync`)."""

from __future__ import annotations

from hf_engines.workers import ActorWorker
from hf_rollout.weight_sync import WeightSending

__all__ = ["SyncActorWorker"]


class SyncActorWorker(WeightSending, ActorWorker):
    """An :class:`~hf_engines.workers.ActorWorker` that can also send its full weights.

    In the ``separate`` placement, rank 0 hosts a :class:`~hf_rollout.WeightChannel` that
    the rollout ranks join; ``send_weights`` streams ``iter_full_params()`` into it. Every
    rank takes part in the iteration (it is collective under FSDP); only rank 0 sends. The
    weight methods (``weight_channel_address``, ``join_weight_channel``, ``send_weights``,
    ``close_weight_channel``) come from :class:`~hf_rollout.weight_sync.WeightSending`.
    """
