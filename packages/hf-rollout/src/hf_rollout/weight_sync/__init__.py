"""Weight sync, actor -> rollout, in one place.

* :mod:`~hf_rollout.weight_sync.channel`: :class:`WeightChannel`, a torch.distributed group
  of its own between actor rank 0 and the rollout ranks (joining, its broadcasts, its
  buffers), and :class:`~hf_rollout.weight_sync.channel.ChannelMember`, a worker's
  membership of one; it imports neither the send nor the receive path, which build on it;
* :mod:`~hf_rollout.weight_sync.wire`: the wire format: how a push's tensors are cut into
  buckets, laid out and described in each bucket's head (and :data:`NamedTensors`, what a
  push carries);
* :mod:`~hf_rollout.weight_sync.sender`: the send path (``send``, ``send_buffered``,
  ``wait_sent`` on a channel), and :class:`WeightSender`, the actor worker's side;
* :mod:`~hf_rollout.weight_sync.sending`: :class:`WeightSending`, the worker methods an
  actor class mixes in (they delegate to its :class:`WeightSender`);
* :mod:`~hf_rollout.weight_sync.receiver`: the receive path (``receive`` on a channel:
  stage and verify a push), and :class:`WeightReceiver`, the rollout worker's side, and
  :func:`fused_actor_weights` (the hybrid placement's in-process path);
* :mod:`~hf_rollout.weight_sync.link`: :class:`WeightLink`, the driver's side, which opens
  the channel, pushes and closes;
* :mod:`~hf_rollout.weight_sync.handshake` (a push's ready / start / done keys in the
  channel's store), :mod:`~hf_rollout.weight_sync.checksum` (per-tensor checksums),
  :mod:`~hf_rollout.weight_sync.errors` and :mod:`~hf_rollout.weight_sync.faults` (fault
  injection for tests).

The rollout worker keeps thin methods (``join_weight_channel``, ``receive_weights``,
``close_weight_channel``) that delegate to its receiver; an actor worker mixes in
:class:`WeightSending`, whose methods delegate to a sender.
"""

from hf_rollout.weight_sync.channel import DEFAULT_TIMEOUT_S, WeightChannel
from hf_rollout.weight_sync.errors import (
    WeightChannelError,
    WeightIntegrityError,
    WeightPushError,
)
from hf_rollout.weight_sync.faults import WeightFaults
from hf_rollout.weight_sync.link import (
    WeightLink,
    WeightPush,
    WeightReceiverGroup,
    WeightSenderGroup,
)
from hf_rollout.weight_sync.receiver import WeightReceiver, fused_actor_weights
from hf_rollout.weight_sync.sender import WeightSender
from hf_rollout.weight_sync.sending import WeightSending
from hf_rollout.weight_sync.wire import DIRECT_BYTES, NamedTensors

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DIRECT_BYTES",
    "NamedTensors",
    "WeightChannel",
    "WeightChannelError",
    "WeightFaults",
    "WeightIntegrityError",
    "WeightLink",
    "WeightPush",
    "WeightPushError",
    "WeightReceiver",
    "WeightReceiverGroup",
    "WeightSender",
    "WeightSenderGroup",
    "WeightSending",
    "fused_actor_weights",
]
