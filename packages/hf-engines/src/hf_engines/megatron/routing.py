"""Router replay (R3) in the Megatron engine: routing megatron's MoE layers as recorded.

The batch field ``routed_experts`` ``(B, T, L, k)`` (see :mod:`hf_protocol.routing`) says
which experts the rollout sent every token to in each MoE layer; ``-1`` where nothing was
recorded (padding, the last sampled token), and there the router keeps its own choice.

megatron-core's ``TopKRouter`` asks its ``router_replay`` attribute for the top-k
(``get_replay_topk(scores, topk, num_groups, group_topk, default_compute_topk)``, inside
``topk_routing_with_score_function``). :class:`RecordedTopK` answers it with the recorded
experts and the router's own scores at those experts, so the gate weights (the softmax over
the chosen logits, i.e. Qwen3's renormalised top-k, or the full softmax's values without
``norm_topk_prob``) are still megatron's computation with the router's gradient; only the
discrete choice is replayed. megatron's own ``RouterReplay`` class is not used: it has no
per-token fallback for unrecorded tokens, it registers every instance in a process-wide
class list (two engines in one process share it), and it keeps every replayed tensor for
activation recomputation until cleared.

Layout: the engine hands the model right-padded rows (:func:`~.pipeline.prepare` rotates
each row's left padding to its end), so the routing is rotated the same way
(:func:`shift_rows`) and padded with ``-1`` like the rows (:func:`pad_routing`). megatron's
hidden states are ``(T, b, h)``: a router sees ``T * b`` tokens sequence-major, token
``t`` of row ``r`` at ``t * b + r`` (:func:`replaying`). With pipeline stages each stage
holds layers ``layer_number - 1`` of the model's ``L``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from megatron.core.models.gpt import GPTModel

Tensor = torch.Tensor
TopKFn = Callable[..., tuple[Tensor, Tensor]]


class RecordedTopK:
    """A ``TopKRouter.router_replay`` that picks recorded experts ``(N, k)`` (-1: its own)."""

    def __init__(self, recorded: Tensor, layer: int) -> None:
        self.recorded = recorded
        self.layer = layer

    def get_replay_topk(
        self,
        scores: Tensor,
        topk: int,
        num_groups: int | None = None,
        group_topk: int | None = None,
        default_compute_topk: TopKFn | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(scores at the chosen experts, chosen experts)``, each ``(N, k)``."""
        if scores.shape[0] != self.recorded.shape[0] or self.recorded.shape[1] != topk:
            raise ValueError(
                f"router replay, MoE layer {self.layer}: the router has {scores.shape[0]} "
                f"tokens and top-k {topk}, the recorded routing {tuple(self.recorded.shape)}; "
                "replay needs the batch's rows exactly as recorded"
            )
        assert default_compute_topk is not None, "megatron passes its own top-k"
        _, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        recorded = self.recorded.to(own.device)
        chosen = torch.where(recorded >= 0, recorded.to(own.dtype), own)
        return scores.gather(1, chosen), chosen


def shift_rows(routed: Tensor, left: Tensor) -> Tensor:
    """``routed`` ``(b, T, L, k)`` with row ``r`` rotated left by ``left[r]`` positions, as
    :func:`~.pipeline.prepare` rotates ``input_ids`` (``left``: ``(b, 1)``)."""
    total = routed.shape[1]
    index = (
        torch.arange(total, device=routed.device).unsqueeze(0) + left.to(routed.device)
    ) % total
    expanded = index[:, :, None, None].expand(-1, -1, *routed.shape[2:])
    return routed.gather(1, expanded)


def pad_routing(routed: Tensor, rows: int, length: int) -> Tensor:
    """``(b, T, L, k)`` ``routed`` padded at the end to ``(rows, length, L, k)`` with -1."""
    out = routed.new_full((rows, length, *routed.shape[2:]), -1)
    out[: routed.shape[0], : routed.shape[1]] = routed
    return out


def _routers(model: GPTModel) -> list[tuple[int, Any]]:
    """``(global layer index, TopKRouter)`` of this stage's MoE layers."""
    return [
        (int(layer.layer_number) - 1, layer.mlp.router)
        for layer in model.decoder.layers
        if hasattr(layer.mlp, "router")
    ]


@contextmanager
def _replay(model: GPTModel, routed: Tensor) -> Iterator[None]:
    """Within the block this stage's routers replay ``routed`` ``(b, T, L, k)``."""
    layers = int(model.config.num_layers)
    if routed.dim() != 4 or routed.shape[2] != layers:
        raise ValueError(
            f"recorded routing has shape {tuple(routed.shape)}; expected (B, T, {layers} MoE "
            "layers, k) for this model"
        )
    # (b, T, k) -> (T, b, k) -> (T * b, k): megatron's sequence-major token order
    flat = routed.long().transpose(0, 1).reshape(-1, layers, routed.shape[3])
    routers = _routers(model)
    before = [router.router_replay for _, router in routers]
    try:
        for layer, router in routers:
            router.router_replay = RecordedTopK(flat[:, layer], layer)
        yield
    finally:
        for (_, router), previous in zip(routers, before, strict=True):
            router.router_replay = previous


def replaying(model: GPTModel, routed: Tensor | None) -> AbstractContextManager[Any]:
    """Route ``model``'s MoE layers as ``routed`` ``(b, T, L, k)`` within the block
    (right-padded rows as the model sees them); nothing changes when ``routed`` is None."""
    return nullcontext() if routed is None else _replay(model, routed)


__all__ = ["RecordedTopK", "pad_routing", "replaying", "shift_rows"]
