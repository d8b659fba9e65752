"""The critic's loss: value regression with PPO-style clipping.

:func:`clipped_value_loss` is the math on tensors; :func:`critic_loss` is the same loss in the
engine calling convention ``loss_fn(outputs, micro_batch)``. Bind its hyper-parameters with
:func:`functools.partial` so the partial pickles through Ray::

    loss_fn = functools.partial(critic_loss, cliprange_value=0.5, loss_agg_mode="token-mean")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from hf_algos.losses.aggregation import aggregate_loss, global_share
from hf_algos.losses.inputs import batch_field, mini_batch_totals
from hf_algos.masked import masked_mean
from hf_protocol import DataProto, fields

if TYPE_CHECKING:  # hf_engines imports transformers; only its types are needed here
    from hf_engines import ModelOutputs


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


def critic_loss(
    outputs: ModelOutputs,
    micro_batch: DataProto,
    *,
    cliprange_value: float | None = 0.5,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss of ``outputs["values"]`` against ``returns``.

    Reads from ``micro_batch.batch``: ``values`` (the critic's predictions when the
    advantages were computed), ``returns``, ``response_mask`` (all ``(b, R)``).
    Returns the micro-batch's share of the mini-batch loss (see
    :func:`~hf_algos.losses.aggregation.global_share`). Metrics (the micro-batch's own):
    ``vf_loss``, ``vf_clipfrac``, ``vpred_mean`` (token mean of the new values).
    """
    vpreds = outputs["values"]
    device = vpreds.device
    mask = batch_field(micro_batch, fields.RESPONSE_MASK, device, "the rollout writes")
    old_values = batch_field(micro_batch, fields.VALUES, device, "critic.compute_values writes")
    returns = batch_field(micro_batch, fields.RETURNS, device, "compute_advantage writes")
    result = clipped_value_loss(
        vpreds,
        old_values,
        returns,
        mask,
        cliprange_value=cliprange_value,
        loss_agg_mode=loss_agg_mode,
    )
    metrics = {
        "vf_loss": float(result.loss.detach()),
        "vf_clipfrac": float(result.clipfrac),
        "vpred_mean": float(masked_mean(vpreds.detach(), mask)),
    }
    totals = mini_batch_totals(micro_batch)
    return global_share(result.loss, mask, loss_agg_mode, totals), metrics
