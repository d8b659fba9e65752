"""Policy-gradient losses: PPO clipped surrogate (clip-higher, dual-clip), GSPO, REINFORCE.

Every loss takes per-token tensors of shape ``(B, R)`` (``log_prob`` with gradient, the
behaviour policy's ``old_log_prob``, ``advantages``, ``response_mask``) and scalars, and
returns a :class:`PolicyLossOutput`. They share one keyword signature so the registry
:data:`POLICY_LOSSES` can pick one by name.

``token_weights`` (optional, ``(B, R)``, no gradient) multiplies each token's loss before
aggregation: the rollout-correction importance weights
(:mod:`hf_algos.losses.rollout_correction`). A weight of 0 drops the token from the loss
while it keeps its place in the aggregation's denominator (and in the engine's global
totals), so masking tokens shrinks the step instead of renormalising it onto fewer tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from hf_algos.losses.aggregation import aggregate_loss
from hf_algos.masked import masked_mean

#: Log-ratios are clamped to this magnitude before ``exp`` so one bad token cannot overflow.
LOG_RATIO_CLAMP = 20.0


class PolicyLossOutput(NamedTuple):
    """What a policy loss returns; every field is a scalar tensor."""

    loss: torch.Tensor
    """The aggregated loss to minimise (with gradient)."""
    clipfrac: torch.Tensor
    """Fraction of valid tokens where the ratio clip was active (no gradient)."""
    approx_kl: torch.Tensor
    """Token mean of ``old_log_prob - log_prob``, the k1 estimate of KL(old || new)."""
    clipfrac_lower: torch.Tensor
    """Fraction of valid tokens where the dual-clip bound (``clip_c``) was active."""


def _check_clip(clip_low: float, clip_high: float, clip_c: float | None) -> None:
    if clip_low < 0 or clip_high < 0:
        raise ValueError(
            f"clip ratios must be >= 0, got clip_low={clip_low}, clip_high={clip_high}; "
            "typical PPO values are 0.2 (and clip_high=0.28 for clip-higher)"
        )
    if clip_c is not None and clip_c <= 1.0:
        raise ValueError(f"clip_c={clip_c} must be > 1 (dual-clip lower bound, e.g. 3.0)")


def _weighted(loss_mat: torch.Tensor, token_weights: torch.Tensor | None) -> torch.Tensor:
    """``loss_mat * token_weights`` (detached), both ``(B, R)``; ``loss_mat`` without them."""
    if token_weights is None:
        return loss_mat
    if token_weights.shape != loss_mat.shape:
        raise ValueError(
            f"token_weights shape {tuple(token_weights.shape)} differs from the loss's "
            f"{tuple(loss_mat.shape)}; both must be (batch, response_length)"
        )
    return loss_mat * token_weights.detach().to(loss_mat.dtype)


def _clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped loss, clip fraction and dual-clip fraction."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), response_mask)
    if clip_c is None:
        return loss, clipfrac.detach(), torch.zeros((), dtype=loss.dtype)
    # Dual clip: for negative advantages the ratio term is unbounded above; cap the loss at
    # -A * clip_c so a huge ratio on a bad token cannot dominate the step.
    capped = torch.minimum(loss, -advantages * clip_c)
    negative = advantages < 0
    lower_frac = masked_mean((torch.gt(loss, capped) & negative).float(), response_mask)
    return torch.where(negative, capped, loss), clipfrac.detach(), lower_frac.detach()


def ppo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    loss_agg_mode: str = "token-mean",
    token_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """PPO clipped surrogate with separate low/high ratio bounds and optional dual-clip.

    Per token: ``r = exp(log_prob - old_log_prob)``,
    ``l = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))``; with ``clip_c`` and
    ``A < 0``, ``l = min(l, -A * clip_c)``; times ``token_weights`` when given. Aggregated
    with ``loss_agg_mode``.
    Shape: all tensors ``(B, R)``.
    """
    _check_clip(clip_low, clip_high, clip_c)
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_mat, clipfrac, lower = _clipped_surrogate(
        ratio, advantages, response_mask, clip_low, clip_high, clip_c
    )
    approx_kl = masked_mean(-log_ratio, response_mask).detach()
    loss = aggregate_loss(_weighted(loss_mat, token_weights), response_mask, loss_agg_mode)
    return PolicyLossOutput(loss, clipfrac, approx_kl, lower)


def gspo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    clip_c: float | None = None,
    loss_agg_mode: str = "seq-mean-token-mean",
    token_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """GSPO: the clipped surrogate on a sequence-level, length-normalised ratio.

    ``s_i = exp(mean_t(log_prob - old_log_prob))`` over the valid tokens of sequence ``i``.
    Each token uses ``s_i * exp(log_prob - sg(log_prob))`` (GSPO-token form: equal to
    ``s_i`` in value, with per-token gradients), so token-level advantages are allowed; with
    one advantage per sequence this is exactly GSPO. Clip ranges are much smaller than
    PPO's (the paper uses 3e-4 / 4e-4). Shape: all tensors ``(B, R)``.
    """
    _check_clip(clip_low, clip_high, clip_c)
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    token_log_ratio = seq_log_ratio.detach().unsqueeze(-1) + log_prob - log_prob.detach()
    ratio = torch.exp(torch.clamp(token_log_ratio, max=LOG_RATIO_CLAMP / 2))
    loss_mat, clipfrac, lower = _clipped_surrogate(
        ratio, advantages, response_mask, clip_low, clip_high, clip_c
    )
    approx_kl = masked_mean(-log_ratio, response_mask).detach()
    loss = aggregate_loss(_weighted(loss_mat, token_weights), response_mask, loss_agg_mode)
    return PolicyLossOutput(loss, clipfrac, approx_kl, lower)


def reinforce_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    loss_agg_mode: str = "token-mean",
    token_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """Plain REINFORCE-style loss ``-A * log_prob`` (on-policy; no ratio, no clip).

    The clip arguments are accepted for a uniform signature and ignored; ``old_log_prob``
    only feeds the ``approx_kl`` metric. Shape: all tensors ``(B, R)``.
    """
    del clip_low, clip_high, clip_c  # same signature as the other losses; unused here
    loss_mat = -advantages * log_prob
    approx_kl = masked_mean(old_log_prob - log_prob, response_mask).detach()
    zero = torch.zeros((), dtype=log_prob.dtype)
    loss = aggregate_loss(_weighted(loss_mat, token_weights), response_mask, loss_agg_mode)
    return PolicyLossOutput(loss, zero, approx_kl, zero)


PolicyLoss = Callable[..., PolicyLossOutput]
"""``loss(log_prob, old_log_prob, advantages, response_mask, *, clip_low, clip_high,
clip_c, loss_agg_mode, token_weights=None) -> PolicyLossOutput``."""

POLICY_LOSSES: dict[str, PolicyLoss] = {}
"""Policy losses by name; add one with :func:`register_policy_loss`."""


def register_policy_loss(name: str, loss: PolicyLoss) -> None:
    """Add ``loss`` to :data:`POLICY_LOSSES` under ``name``; a name used twice is an error."""
    if name in POLICY_LOSSES:
        raise ValueError(f"policy loss {name!r} is already registered; pick another name")
    POLICY_LOSSES[name] = loss


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss called ``name``; the error lists the registered names."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        known = ", ".join(sorted(POLICY_LOSSES))
        raise ValueError(f"unknown policy loss {name!r}; choose one of {known}") from None


register_policy_loss("ppo", ppo_policy_loss)
register_policy_loss("gspo", gspo_policy_loss)
register_policy_loss("reinforce", reinforce_policy_loss)
