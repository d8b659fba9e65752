"""The entropy bonus of the policy loss."""

from __future__ import annotations

import torch

from hf_algos.losses.aggregation import aggregate_loss


def entropy_bonus(
    entropy: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """The policy entropy aggregated like the policy loss; subtract ``coeff *`` it.

    Shape: ``entropy`` and ``response_mask`` ``(B, R)``; returns a scalar.
    """
    return aggregate_loss(entropy, response_mask, loss_agg_mode)
