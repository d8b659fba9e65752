"""Token-level scores: one score per sample, placed on the last valid response token."""

from __future__ import annotations

import torch

from hf_protocol import DataProto, fields


def response_mask_of(batch: DataProto) -> torch.Tensor:
    """``response_mask`` ``(B, R)``, or the response part of ``attention_mask`` if absent."""
    if batch.batch is None or fields.RESPONSES not in batch.batch:
        raise KeyError("the batch has no 'responses' tensor; score a rollout output batch")
    if fields.RESPONSE_MASK in batch.batch:
        return batch.batch[fields.RESPONSE_MASK]
    response_length = batch.batch[fields.RESPONSES].shape[1]
    return batch.batch[fields.ATTENTION_MASK][:, -response_length:]


def last_token_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 in each row of ``response_mask`` ``(B, R)``; 0 for an empty row."""
    length = response_mask.shape[1]
    positions = torch.arange(length, device=response_mask.device).expand_as(response_mask)
    return torch.where(response_mask.bool(), positions, 0).amax(dim=1)


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A ``(B, R)`` float32 tensor of zeros with ``scores[b]`` at the last valid token of row b.

    Shape: scores ``(B,)``, response_mask ``(B, R)`` -> ``(B, R)``.
    """
    out = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
    index = last_token_index(response_mask).unsqueeze(1)
    return out.scatter_(1, index, scores.to(out.dtype).unsqueeze(1))
