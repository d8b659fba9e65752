"""The rollout side of weight sync: where a rollout worker's new weights come from.

Two paths, one per placement:

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

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from hf_rollout.base import RolloutEngine
from hf_rollout.weight_sync.channel import DEFAULT_TIMEOUT_S, ChannelMember

__all__ = ["NamedTensors", "WeightReceiver", "fused_actor_weights"]

NamedTensors = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]
"""Full weights as ``(name, tensor)`` pairs or a name -> tensor mapping (names as in the
Hugging Face model's ``state_dict()``): what a rollout worker's ``update_weights`` takes."""


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
        stream = self.channel.receive()
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
