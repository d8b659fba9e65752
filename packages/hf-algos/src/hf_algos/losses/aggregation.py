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
gives 0.

Global normalisers (engines): a training engine hands every micro-batch the totals of its
mini-batch over all data-parallel ranks (``meta_info[fields.MINI_BATCH_TOTALS]``: response
tokens and sequences) and expects the micro-batch's *share* of the mini-batch loss back.
:func:`global_share` turns a micro-batch aggregate into that share: ``token-mean`` sums over
tokens and divides by the total tokens, the ``seq-mean-*`` modes sum over sequences and divide
by the total sequences, so every mode is exact over the whole mini-batch whatever the
micro-batch size and the number of ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def global_share(
    loss: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    totals: Mapping[str, float] | None,
) -> torch.Tensor:
    """This micro-batch's share of a mini-batch loss aggregated as ``mode``.

    ``loss`` is :func:`aggregate_loss` over the micro-batch (its own mean); the share is
    ``loss * local count / global count``, where the count is the valid tokens for
    ``token-mean`` and the sequences (rows with a valid token) for the ``seq-mean-*`` modes,
    and the global counts are ``totals["tokens"]`` / ``totals["sequences"]`` over the whole
    mini-batch (what the engine writes to ``meta_info[fields.MINI_BATCH_TOTALS]``). The
    shares of all micro-batches add up to the mini-batch's aggregate. ``totals=None`` (called
    outside an engine) returns ``loss`` unchanged.

    Shape: ``loss`` scalar, ``response_mask`` ``(b, R)``; returns a scalar tensor.
    """
    check_loss_agg_mode(mode)
    if totals is None:
        return loss
    mask = response_mask.to(loss.dtype)
    if mode == "token-mean":
        local, total = mask.sum(), float(totals["tokens"])
    else:
        local, total = (mask.sum(dim=-1) > 0).to(loss.dtype).sum(), float(totals["sequences"])
    if total <= 0:
        raise ValueError(
            f"the mini-batch totals {dict(totals)} count nothing to average over; an engine "
            "must not run a step on a mini-batch without response tokens"
        )
    return loss * (local / total)
