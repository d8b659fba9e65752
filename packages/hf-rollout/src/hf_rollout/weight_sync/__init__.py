"""Weight sync, actor -> rollout, in one place.

* :mod:`~hf_rollout.weight_sync.channel`: :class:`WeightChannel`, a torch.distributed group
  of its own between actor rank 0 and the rollout ranks, streaming buckets of tensors;
* :mod:`~hf_rollout.weight_sync.sender`: :class:`WeightSender`, the actor worker's side;
* :mod:`~hf_rollout.weight_sync.receiver`: :class:`WeightReceiver`, the rollout worker's
  side, and :func:`fused_actor_weights` (the hybrid placement's in-process path);
* :mod:`~hf_rollout.weight_sync.link`: :class:`WeightLink`, the driver's side, which opens
  the channel, pushes and closes.

The worker classes keep thin methods (``join_weight_channel``, ``send_weights``,
``receive_weights``, ``close_weight_channel``) that delegate to the sender and receiver.
"""

from hf_rollout.weight_sync.channel import (
    DEFAULT_TIMEOUT_S,
    DIRECT_BYTES,
    WeightChannel,
    WeightChannelError,
)
from hf_rollout.weight_sync.link import (
    WeightLink,
    WeightPush,
    WeightReceiverGroup,
    WeightSenderGroup,
)
from hf_rollout.weight_sync.receiver import NamedTensors, WeightReceiver, fused_actor_weights
from hf_rollout.weight_sync.sender import WeightSender

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DIRECT_BYTES",
    "NamedTensors",
    "WeightChannel",
    "WeightChannelError",
    "WeightLink",
    "WeightPush",
    "WeightReceiver",
    "WeightReceiverGroup",
    "WeightSender",
    "WeightSenderGroup",
    "fused_actor_weights",
]
