"""The supervised fine-tuning loss: negative log-likelihood of the target tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hf_algos.losses.aggregation import global_share
from hf_algos.losses.inputs import batch_field, mini_batch_totals
from hf_protocol import DataProto, fields

if TYPE_CHECKING:  # hf_engines imports transformers; only its types are needed here
    from hf_engines import ModelOutputs


def sft_loss(
    outputs: ModelOutputs, micro_batch: DataProto
) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative log-likelihood per target token (token mean over ``response_mask``).

    Reads ``outputs["log_probs"]`` ``(b, R)`` and ``response_mask`` ``(b, R)``.
    Returns the micro-batch's share of the mini-batch token mean (see
    :func:`~hf_algos.losses.aggregation.global_share`). Metrics (the micro-batch's own):
    ``sft_nll`` and ``sft_ppl`` (``exp(nll)``).
    """
    log_probs = outputs["log_probs"]
    mask = batch_field(
        micro_batch, fields.RESPONSE_MASK, log_probs.device, "the SFT collate writes"
    )
    mask = mask.to(log_probs.dtype)
    loss = -(log_probs * mask).sum() / mask.sum().clamp(min=1.0)
    nll = float(loss.detach())
    share = global_share(loss, mask, "token-mean", mini_batch_totals(micro_batch))
    return share, {"sft_nll": nll, "sft_ppl": float(torch.exp(loss.detach()))}
