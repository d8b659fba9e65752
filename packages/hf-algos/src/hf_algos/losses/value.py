"""The critic's loss: value regression with PPO-style clipping."""

from __future__ import annotations

from typing import NamedTuple

import torch

from hf_algos.losses.aggregation import aggregate_loss
from hf_algos.masked import masked_mean


class ValueLossOutput(NamedTuple):
    """What :func:`clipped_value_loss` returns; every field is a scalar tensor."""

    loss: torch.Tensor
    """The aggregated loss to minimise (with gradient)."""
    clipfrac: torch.Tensor
    """Fraction of valid tokens where the clipped error was the larger one (no gradient)."""


def clipped_value_loss(
    vpreds: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cliprange_value: float | None = 0.5,
    loss_agg_mode: str = "token-mean",
) -> ValueLossOutput:
    """PPO value loss ``0.5 * max((v - G)^2, (v_clip - G)^2)``, aggregated.

    ``v_clip = old_values + clip(v - old_values, -cliprange_value, cliprange_value)`` keeps
    the new prediction near the one used for the advantages. ``cliprange_value=None`` turns
    clipping off (plain ``0.5 * (v - G)^2``). Shape: all tensors ``(B, R)``.
    """
    unclipped = (vpreds - returns) ** 2
    if cliprange_value is None:
        loss_mat = 0.5 * unclipped
        clipfrac = torch.zeros((), dtype=vpreds.dtype)
    else:
        if cliprange_value < 0:
            raise ValueError(f"cliprange_value={cliprange_value} must be >= 0 (or None: off)")
        delta = torch.clamp(vpreds - old_values, -cliprange_value, cliprange_value)
        clipped = (old_values + delta - returns) ** 2
        loss_mat = 0.5 * torch.maximum(unclipped, clipped)
        clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), response_mask).detach()
    return ValueLossOutput(aggregate_loss(loss_mat, response_mask, loss_agg_mode), clipfrac)
