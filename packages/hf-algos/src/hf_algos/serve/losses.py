"""The Tinker API's built-in losses as pure tensor functions (sums, never means).

Every loss reads the policy's log-probs of the target tokens (``target_logprobs``, what the
engine computes) and per-token inputs of the same shape, ``(B, R)``; positions where
``mask`` is 0 (padding) add nothing. As Tinker defines them:

* ``cross_entropy``: ``-(target_logprobs * weights).sum()``;
* ``importance_sampling``: ``-(exp(target_logprobs - logprobs) * advantages).sum()``, where
  ``logprobs`` are the sampler's;
* ``ppo``: ``-min(ratio * A, clip(ratio, low, high) * A).sum()``;
* ``cispo``: ``-(clip(ratio, low, high).detach() * target_logprobs * A).sum()``.

``low`` / ``high`` are ``loss_fn_config`` ``clip_low_threshold`` / ``clip_high_threshold``
(defaults 0.8 / 1.2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

CLIP_LOW, CLIP_HIGH = 0.8, 1.2
"""Default ratio bounds of ``ppo`` and ``cispo`` (Tinker's: epsilon 0.2)."""

INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
}
"""The ``loss_fn_inputs`` each loss needs (every datum, each as long as its input)."""

CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "cross_entropy": (),
    "importance_sampling": (),
    "ppo": ("clip_low_threshold", "clip_high_threshold"),
    "cispo": ("clip_low_threshold", "clip_high_threshold"),
}
"""The ``loss_fn_config`` keys each loss reads."""

Inputs = Mapping[str, torch.Tensor]


def cross_entropy(
    target_logprobs: torch.Tensor, inputs: Inputs, config: Mapping[str, float]
) -> torch.Tensor:
    """Weighted negative log-likelihood of the targets, summed."""
    return -(target_logprobs * inputs["weights"]).sum()


def importance_sampling(
    target_logprobs: torch.Tensor, inputs: Inputs, config: Mapping[str, float]
) -> torch.Tensor:
    """REINFORCE with the importance ratio to the sampler's log-probs, summed."""
    ratio = torch.exp(target_logprobs - inputs["logprobs"])
    return -(ratio * inputs["advantages"]).sum()


def _clip_bounds(config: Mapping[str, float]) -> tuple[float, float]:
    return (
        float(config.get("clip_low_threshold", CLIP_LOW)),
        float(config.get("clip_high_threshold", CLIP_HIGH)),
    )


def ppo(target_logprobs: torch.Tensor, inputs: Inputs, config: Mapping[str, float]) -> torch.Tensor:
    """PPO's clipped surrogate objective (pessimistic of clipped and unclipped), summed."""
    low, high = _clip_bounds(config)
    ratio = torch.exp(target_logprobs - inputs["logprobs"])
    advantages = inputs["advantages"]
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)
    return -surrogate.sum()


def cispo(
    target_logprobs: torch.Tensor, inputs: Inputs, config: Mapping[str, float]
) -> torch.Tensor:
    """CISPO: the clipped ratio as a constant weight on the log-likelihood, summed."""
    low, high = _clip_bounds(config)
    weight = torch.exp(target_logprobs - inputs["logprobs"]).clamp(low, high).detach()
    return -(weight * target_logprobs * inputs["advantages"]).sum()


LossFunction = Callable[[torch.Tensor, Inputs, Mapping[str, float]], torch.Tensor]

LOSSES: dict[str, LossFunction] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
}
"""The losses served, by the name a client sends."""


def tinker_loss(
    name: str,
    target_logprobs: torch.Tensor,
    inputs: Inputs,
    config: Mapping[str, float],
    mask: torch.Tensor,
) -> torch.Tensor:
    """Loss ``name`` summed over the positions where ``mask`` is 1 (padding masked out)."""
    keep = mask.to(target_logprobs.dtype)
    masked = {key: value * keep for key, value in inputs.items() if value.is_floating_point()}
    return LOSSES[name](target_logprobs * keep, masked, config)
