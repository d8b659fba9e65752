"""The critic's loss in the engine calling convention ``loss_fn(outputs, micro_batch)``.

Bind the hyper-parameters with :func:`functools.partial` so the partial pickles through Ray::

    loss_fn = functools.partial(critic_loss, cliprange_value=0.5, loss_agg_mode="token-mean")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hf_algos.losses.aggregation import global_share
from hf_algos.losses.inputs import batch_field, mini_batch_totals
from hf_algos.losses.value import clipped_value_loss
from hf_algos.masked import masked_mean
from hf_protocol import DataProto, fields

if TYPE_CHECKING:  # hf_engines imports transformers; only its types are needed here
    from hf_engines import ModelOutputs


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
