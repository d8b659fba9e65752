"""Rollout correction: importance weights for the gap between the sampler and the trainer.

The rollout engine samples a response and reports its own log-prob of every token
(``rollout_log_probs``); the actor recomputes them (``old_log_probs``). The two differ by
numerics (vLLM's kernels and dtype against the training engine's) and, in the asynchronous
modes, by policy lag (the sample came from older weights). The policy gradient assumes the
samples come from ``old_log_probs``' policy, so each token is reweighted by the ratio
``r = exp(old_log_probs - rollout_log_probs)`` (the trainer's probability over the
sampler's), bounded so a few tokens the sampler found unlikely cannot dominate the step:

- **TIS** (truncated importance sampling): weight ``min(r, cap)``; every token still
  teaches, the rare large ratios are cut to ``cap``.
- **MIS** (masked importance sampling): weight ``r`` inside ``[low, high]`` and 0 outside:
  tokens (or whole sequences) the two policies disagree on too much are dropped from the
  policy loss rather than trusted with a clipped weight.

``level="sequence"`` uses one ratio per sequence, the **geometric mean** of its token
ratios ``exp(mean_t log r_t)`` over its valid tokens, for every token of that sequence. The
geometric mean is length-normalised: a 500-token answer whose tokens each disagree a little
is judged like a 5-token one, where the product of ratios (or "any token out of band")
would mask nearly every long sequence.

Weights carry no gradient (they correct the sampling distribution, they are not part of the
objective) and are 0 on padding. The metrics are over the valid response tokens of the
batch the driver holds (the whole step's batch), so they need no cross-worker sums; the
weighted loss itself is aggregated by the policy losses and shared across micro-batches and
ranks by :func:`~hf_algos.losses.aggregation.global_share` like any other loss.
"""

from __future__ import annotations

from typing import Final, Literal, NamedTuple

import torch

from hf_algos.losses.policy import LOG_RATIO_CLAMP
from hf_algos.masked import masked_mean

CorrectionMode = Literal["off", "tis", "mis"]
CorrectionLevel = Literal["token", "sequence"]

CORRECTION_MODES: Final[tuple[str, ...]] = ("off", "tis", "mis")
"""Accepted ``mode`` names: no correction, truncated IS, masked IS."""
CORRECTION_LEVELS: Final[tuple[str, ...]] = ("token", "sequence")
"""Accepted ``level`` names: a ratio per token, or one per sequence (geometric mean)."""


class RolloutCorrection(NamedTuple):
    """Per-token weights for the policy loss and the step's mismatch metrics."""

    weights: torch.Tensor
    """``(B, R)`` float, detached: multiplies the per-token policy loss; 0 on padding."""
    metrics: dict[str, float]
    """``rollout_correction/*`` metrics (see :func:`rollout_correction_metrics`)."""


def rollout_log_ratio(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """Per-token ``log r = old_log_probs - rollout_log_probs``, 0 on padding.

    Clamped to ``+-LOG_RATIO_CLAMP`` so ``exp`` cannot overflow on a token one side found
    impossible. Shape: all ``(B, R)``; returns ``(B, R)`` float, detached.
    """
    if old_log_probs.shape != rollout_log_probs.shape:
        raise ValueError(
            f"old_log_probs {tuple(old_log_probs.shape)} and rollout_log_probs "
            f"{tuple(rollout_log_probs.shape)} differ in shape; both must be (batch, response)"
        )
    log_ratio = (old_log_probs.detach() - rollout_log_probs.detach()).float()
    log_ratio = torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return log_ratio * response_mask.to(log_ratio.dtype)


def sequence_log_ratio(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each sequence's mean token log-ratio (log of the geometric-mean ratio), repeated over
    its tokens; 0 on padding and on rows without a valid token.

    Shape: ``(B, R)`` in and out.
    """
    mask = response_mask.to(log_ratio.dtype)
    per_sequence = masked_mean(log_ratio, mask, dim=-1)
    return per_sequence.unsqueeze(-1) * mask


def truncated_is_weights(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """TIS: weights ``min(exp(log_ratio), cap)`` and where the cap was hit.

    Shape: ``(B, R)`` in; returns ``(weights, clipped)``, both ``(B, R)`` (``clipped`` bool),
    0 / False on padding.
    """
    if cap <= 0:
        raise ValueError(f"rollout_is_cap={cap} must be > 0 (e.g. 2.0)")
    valid = response_mask.bool()
    ratio = torch.exp(log_ratio)
    clipped = (ratio > cap) & valid
    weights = torch.clamp(ratio, max=cap) * valid.to(ratio.dtype)
    return weights, clipped


def masked_is_weights(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """MIS: weights ``exp(log_ratio)`` inside ``[low, high]``, 0 outside, and the masked set.

    Shape: ``(B, R)`` in; returns ``(weights, masked)``, both ``(B, R)`` (``masked`` bool),
    0 / False on padding.
    """
    if not 0 <= low < 1 < high:
        raise ValueError(
            f"the MIS band [mis_low={low}, mis_high={high}] must hold 1 with 0 <= low < 1 < "
            "high (e.g. [0.5, 2.0])"
        )
    valid = response_mask.bool()
    ratio = torch.exp(log_ratio)
    masked = ((ratio < low) | (ratio > high)) & valid
    weights = torch.where(masked | ~valid, torch.zeros_like(ratio), ratio)
    return weights, masked


def mismatch_kl(
    log_ratio: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k1 and k3 estimates of ``KL(rollout || trainer)`` from the rollout's samples.

    With ``log r = old - rollout`` and tokens drawn from the rollout policy:
    ``k1 = mean(-log r)`` (unbiased, may be negative on a batch) and
    ``k3 = mean(r - 1 - log r)`` (unbiased, never negative, lower variance). Means over
    the valid tokens. Shape: ``(B, R)`` in; returns two scalars.
    """
    k1 = masked_mean(-log_ratio, response_mask)
    k3 = masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, response_mask)
    return k1, k3


def rollout_correction_metrics(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    weights: torch.Tensor,
    affected: torch.Tensor,
    mode: CorrectionMode,
) -> dict[str, float]:
    """The step's ``rollout_correction/*`` metrics over the valid response tokens.

    ``kl_k1`` / ``kl_k3`` (:func:`mismatch_kl`), ``ratio_mean`` / ``ratio_max`` /
    ``ratio_min`` (token ratios ``exp(log_ratio)``), ``weight_mean``, and
    ``clipped_frac`` (TIS) or ``masked_frac`` (MIS): the fraction of valid tokens whose
    weight was capped / set to 0. Shape: all tensors ``(B, R)``; ``affected`` bool.
    """
    valid = response_mask.bool()
    k1, k3 = mismatch_kl(log_ratio, response_mask)
    ratio = torch.exp(log_ratio[valid])
    metrics = {
        "rollout_correction/kl_k1": float(k1),
        "rollout_correction/kl_k3": float(k3),
        "rollout_correction/ratio_mean": float(ratio.mean()) if ratio.numel() else 1.0,
        "rollout_correction/ratio_max": float(ratio.max()) if ratio.numel() else 1.0,
        "rollout_correction/ratio_min": float(ratio.min()) if ratio.numel() else 1.0,
        "rollout_correction/weight_mean": float(masked_mean(weights, response_mask)),
    }
    if mode != "off":
        name = "clipped_frac" if mode == "tis" else "masked_frac"
        metrics[f"rollout_correction/{name}"] = float(masked_mean(affected.float(), valid))
    return metrics


def compute_rollout_correction(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    mode: CorrectionMode,
    level: CorrectionLevel = "token",
    rollout_is_cap: float = 2.0,
    mis_low: float = 0.5,
    mis_high: float = 2.0,
) -> RolloutCorrection:
    """Weights for the policy loss and the mismatch metrics, as ``mode`` and ``level`` say.

    ``mode="off"`` gives weights 1 on valid tokens (the metrics still measure the
    mismatch). The ratio is per token, or per sequence for ``level="sequence"`` (geometric
    mean, see the module docstring); the metrics' ratios and KL are always per token.
    Shape: all tensors ``(B, R)``; ``weights`` ``(B, R)`` float32, detached.
    """
    if mode not in CORRECTION_MODES:
        raise ValueError(f"unknown rollout correction mode {mode!r}; choose one of off, tis, mis")
    if level not in CORRECTION_LEVELS:
        raise ValueError(f"unknown rollout correction level {level!r}; choose token or sequence")
    log_ratio = rollout_log_ratio(old_log_probs, rollout_log_probs, response_mask)
    scored = sequence_log_ratio(log_ratio, response_mask) if level == "sequence" else log_ratio
    valid = response_mask.bool()
    if mode == "tis":
        weights, affected = truncated_is_weights(scored, response_mask, rollout_is_cap)
    elif mode == "mis":
        weights, affected = masked_is_weights(scored, response_mask, mis_low, mis_high)
    else:
        weights, affected = valid.to(log_ratio.dtype), torch.zeros_like(valid)
    metrics = rollout_correction_metrics(log_ratio, response_mask, weights, affected, mode)
    return RolloutCorrection(weights.detach(), metrics)
