"""Mixture-of-experts routing: recording each token's experts, and replaying them (R3).

Rollout replay of routing ("R3"): the rollout records which experts every token went to,
and the actor's forward on the same sequence routes each token to those experts instead of
its own router's top-k. The gate weights still come from the actor's router (its softmax at
the recorded experts, renormalised as the model does), so the router keeps its gradient;
only the discrete choice is replayed. This removes the largest source of rollout-vs-actor
log-prob mismatch in MoE models: a tiny numerical difference (bf16 vs fp32, another kernel,
a weight update in between) can flip a token's top-k and change its output completely.

The hooks work on transformers' top-k router modules (``Qwen3MoeTopKRouter`` and its
siblings: a ``weight`` ``(E, H)``, ``top_k``, ``num_experts``, ``norm_topk_prob``, and a
forward returning ``(logits, weights, indices)``); :func:`routers` finds them in layer order.

The batch field :data:`ROUTED_EXPERTS` is ``(B, T, L, k)`` int16, aligned with
``input_ids``: ``[b, t, l]`` are the experts of token ``t`` in MoE layer ``l``, ``-1``
where nothing was recorded (padding, the last sampled token); those tokens use the actor's
own choice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch.nn import functional

ROUTED_EXPERTS = "routed_experts"
"""Batch field: ``(B, T, L, k)`` int16 expert indices per token and MoE layer (-1: none)."""


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's top-k router modules, in layer order (empty for a dense model)."""
    return [
        module
        for module in model.modules()
        if type(module).__name__.endswith("TopKRouter")
        and hasattr(module, "top_k")
        and hasattr(module, "weight")
    ]


class RoutingRecorder:
    """Collects the expert indices every router call returns, per layer, in call order."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.layers = routers(model)
        if not self.layers:
            raise ValueError(
                f"{type(model).__name__} has no top-k router modules; routing is recorded for "
                "mixture-of-experts models only (e.g. model_type='qwen3_moe')"
            )
        self.calls: list[list[torch.Tensor]] = [[] for _ in self.layers]
        self._handles = [
            layer.register_forward_hook(self._hook(index))
            for index, layer in enumerate(self.layers)
        ]

    def _hook(self, index: int) -> Any:
        def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
            self.calls[index].append(output[2].detach().to(torch.int16))

        return keep

    def pop(self) -> torch.Tensor:
        """The last forward's indices, ``(N, L, k)`` (N tokens, flattened row-major)."""
        taken = [calls.pop() for calls in self.calls]
        for calls in self.calls:
            calls.clear()
        return torch.stack(taken, dim=1)

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()


def _weight(router: torch.nn.Module) -> torch.Tensor:
    """A router's ``(E, H)`` weight."""
    return cast(torch.Tensor, router.weight)


def _replayed_forward(router: torch.nn.Module, recorded: torch.Tensor) -> Any:
    """A router forward that picks the ``recorded`` ``(N, k)`` experts (-1: its own)."""

    top_k = int(cast(int, router.top_k))

    def forward(hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        weight = _weight(router)  # read per call: FSDP swaps in the unsharded tensor
        hidden = hidden_states.reshape(-1, weight.shape[1])
        if hidden.shape[0] != recorded.shape[0]:
            raise ValueError(
                f"router replay: the forward has {hidden.shape[0]} tokens but the recorded "
                f"routing {recorded.shape[0]}; replay needs the rows exactly as recorded "
                "(padding mode 'off')"
            )
        logits = functional.linear(hidden, weight)
        probs = torch.softmax(logits, dtype=torch.float, dim=-1)
        own = torch.topk(probs, top_k, dim=-1).indices
        chosen = torch.where(recorded >= 0, recorded.to(own.dtype), own)
        weights = probs.gather(-1, chosen)
        if getattr(router, "norm_topk_prob", False):
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(logits.dtype), chosen

    return forward


@contextmanager
def replay_routing(model: torch.nn.Module, routed: torch.Tensor) -> Iterator[None]:
    """Within the block, ``model``'s routers use ``routed`` ``(B, T, L, k)`` (one forward
    over the same ``(B, T)`` rows; -1 entries keep the router's own top-k)."""
    layers = routers(model)
    if routed.dim() != 4 or routed.shape[2] != len(layers):
        raise ValueError(
            f"recorded routing has shape {tuple(routed.shape)}; expected (B, T, "
            f"{len(layers)} MoE layers, k) for {type(model).__name__}"
        )
    flat = routed.reshape(-1, routed.shape[2], routed.shape[3]).long()
    try:
        for index, router in enumerate(layers):
            recorded = flat[:, index].to(_weight(router).device)
            router.forward = _replayed_forward(router, recorded)
        yield
    finally:
        for router in layers:
            router.__dict__.pop("forward", None)
