"""Reducing a per-token loss matrix to a scalar: the loss aggregation modes.

How tokens are weighted matters for long responses (DAPO, Dr. GRPO):

- ``token-mean``: every valid token in the batch weighs the same,
  ``sum(loss * mask) / sum(mask)``.
- ``seq-mean-token-sum``: sum over each sequence's tokens, then mean over sequences.
- ``seq-mean-token-mean``: mean over each sequence's tokens, then mean over sequences (the
  original GRPO objective; short sequences weigh more per token).
- ``seq-mean-token-sum-norm``: sum over each sequence's tokens divided by a constant
  (``norm_length``, default the padded response length ``R``), then mean over sequences
  (Dr. GRPO: no length bias, since the divisor is the same for every sequence).

Sequence means are over rows with at least one valid token; a batch without any valid token
gives 0. Note for engines: :class:`hf_engines.TrainingEngine` weights each micro-batch's loss
by its share of response tokens, which makes ``token-mean`` exact over the whole mini-batch;
the ``seq-mean-*`` modes are then exact per micro-batch and a token-weighted average across
micro-batches.
"""

from __future__ import annotations

from typing import Final

import torch

from hf_algos.masked import masked_mean, masked_sum

LOSS_AGG_MODES: Final[tuple[str, ...]] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
"""The accepted ``loss_agg_mode`` names."""


def check_loss_agg_mode(mode: str) -> str:
    """Return ``mode`` if it is a known aggregation mode, else raise naming the choices."""
    if mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"unknown loss_agg_mode {mode!r}; choose one of {', '.join(LOSS_AGG_MODES)}"
        )
    return mode


def _mean_over_sequences(per_sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``per_sequence`` (B,) over rows whose mask has a valid token."""
    has_tokens = (mask.sum(dim=-1) > 0).to(per_sequence.dtype)
    return masked_mean(per_sequence, has_tokens)


def aggregate_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int | None = None
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar as ``mode`` says (see the module docstring).

    Shape: ``loss_mat`` and ``mask`` ``(B, R)``; returns a scalar tensor.
    ``norm_length`` is the constant divisor of ``seq-mean-token-sum-norm`` (default ``R``);
    keep it fixed over training (e.g. the maximum response length) so steps compare.
    """
    check_loss_agg_mode(mode)
    if loss_mat.shape != mask.shape:
        raise ValueError(
            f"loss_mat shape {tuple(loss_mat.shape)} and mask shape {tuple(mask.shape)} differ; "
            "both must be (batch, response_length)"
        )
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    token_sums = masked_sum(loss_mat, mask, dim=-1)
    if mode == "seq-mean-token-sum":
        return _mean_over_sequences(token_sums, mask)
    if mode == "seq-mean-token-mean":
        counts = mask.to(loss_mat.dtype).sum(dim=-1).clamp(min=1.0)
        return _mean_over_sequences(token_sums / counts, mask)
    divisor = loss_mat.shape[-1] if norm_length is None else norm_length
    if divisor <= 0:
        raise ValueError(f"norm_length={norm_length} must be positive (e.g. max response length)")
    return _mean_over_sequences(token_sums / divisor, mask)
