"""The supervised fine-tuning loss: negative log-likelihood of the target tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hf_algos.losses.inputs import batch_field
from hf_protocol import DataProto, fields

if TYPE_CHECKING:  # hf_engines imports transformers; only its types are needed here
    from hf_engines import ModelOutputs


def sft_loss(
    outputs: ModelOutputs, micro_batch: DataProto
) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative log-likelihood per target token (token mean over ``response_mask``).

    Reads ``outputs["log_probs"]`` ``(b, R)`` and ``response_mask`` ``(b, R)``.
    Metrics: ``sft_nll`` (the loss) and ``sft_ppl`` (``exp(nll)``).
    """
    log_probs = outputs["log_probs"]
    mask = batch_field(
        micro_batch, fields.RESPONSE_MASK, log_probs.device, "the SFT collate writes"
    )
    mask = mask.to(log_probs.dtype)
    loss = -(log_probs * mask).sum() / mask.sum().clamp(min=1.0)
    nll = float(loss.detach())
    return loss, {"sft_nll": nll, "sft_ppl": float(torch.exp(loss.detach()))}
