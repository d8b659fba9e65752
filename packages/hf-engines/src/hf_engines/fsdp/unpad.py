"""Taking padding tokens out of the compute, as pure index arithmetic on the batch.

Batches are prompt + response rows, prompts left-padded and responses right-padded, so a
row's real tokens are one contiguous run. Two ways to skip the padding:

* **pack**: every real token of the micro-batch goes into one row ``(1, N)`` with
  ``position_ids`` restarting at 0 for each sequence and no attention mask; transformers
  reads the restarts as sequence boundaries (varlen kernels for flash attention, a
  block-diagonal mask for sdpa / eager). Linear layers then see exactly the ``N`` real
  tokens. With a dense (sdpa / eager) kernel attention costs ``N**2`` instead of
  ``B * T**2``, so packing pays off with flash attention, where it costs nothing.
* **trim**: drop the columns that are padding in *every* row of the micro-batch (the
  left end of the prompts, the right end of the responses). It works with any kernel and
  removes all padding when a micro-batch holds one row.

Shapes: ``B`` rows, ``T`` positions, ``R`` response positions, ``N`` real tokens, ``K``
real response tokens that have a real token before them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

PaddingMode = Literal["pack", "trim", "off"]
_PACKING_KERNELS = ("flash_attention", "flash-attn", "flash_attn")


def choose_padding_mode(attn_implementation: str, requested: str = "auto") -> PaddingMode:
    """The mode ``requested``; for ``auto``, ``pack`` with flash-attention kernels (varlen,
    no wasted work) and ``trim`` with any other kernel."""
    if requested in ("pack", "trim", "off"):
        return requested  # type: ignore[return-value]
    if requested != "auto":
        raise ValueError(f"remove_padding={requested!r} is not one of auto, pack, trim, off")
    if any(name in attn_implementation for name in _PACKING_KERNELS):
        return "pack"
    return "trim"


def scored_response_mask(attention_mask: torch.Tensor, response_length: int) -> torch.Tensor:
    """Which response positions get outputs: the token is real and so is the one before it.

    Outputs elsewhere are defined as 0 in every mode, so modes agree exactly.

    Shape: ``(B, T)`` -> ``(B, R)`` bool.
    """
    mask = attention_mask.bool()
    return mask[:, -response_length:] & mask[:, -response_length - 1 : -1]


def trim_window(attention_mask: torch.Tensor, response_length: int) -> tuple[int, int]:
    """Columns ``[start, stop)`` to keep: all but the all-padding columns at either end.

    At least the position before the first response token and one response column are
    kept, so the response positions stay where :func:`response_positions` expects them.
    """
    total = attention_mask.shape[1]
    prompt_end = total - response_length
    used = torch.nonzero(attention_mask.bool().any(dim=0)).squeeze(-1)
    if used.numel() == 0:
        return prompt_end - 1, prompt_end + 1
    start = min(int(used[0]), prompt_end - 1)
    stop = max(int(used[-1]) + 1, prompt_end + 1)
    return start, stop


@dataclass(frozen=True)
class PackedRows:
    """A micro-batch's real tokens in one row, and where response outputs go back."""

    input_ids: torch.Tensor
    """Shape ``(1, N)``: every real token, row after row."""
    position_ids: torch.Tensor
    """Shape ``(1, N)``: each sequence's own positions, restarting at 0."""
    predict_index: torch.Tensor
    """Shape ``(K,)``: packed positions whose outputs predict a scored response token."""
    rows: torch.Tensor
    """Shape ``(K,)``: the ``(B, R)`` row of each predicted token."""
    cols: torch.Tensor
    """Shape ``(K,)``: the ``(B, R)`` response column of each predicted token."""


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    require_scored: bool = True,
) -> PackedRows | None:
    """Pack the real tokens of ``(B, T)`` rows into one ``(1, N)`` row.

    Returns ``None`` when packing would change the result: a row whose real tokens do not
    carry positions ``0, 1, ..., L-1`` (its boundaries could not be told from a restart),
    or (with ``require_scored``) a micro-batch without any scored response token.
    """
    mask = attention_mask.bool()
    if position_ids.dim() != 2 or not torch.equal(
        position_ids[mask], (mask.long().cumsum(dim=1) - 1)[mask]
    ):
        return None
    scored = scored_response_mask(attention_mask, response_length)
    if require_scored and not scored.any():
        return None
    packed_index = mask.flatten().long().cumsum(0).view_as(mask) - 1
    total = mask.shape[1]
    predictors = packed_index[:, total - response_length - 1 : total - 1]
    rows, cols = torch.nonzero(scored, as_tuple=True)
    return PackedRows(
        input_ids=input_ids[mask].unsqueeze(0),
        position_ids=position_ids[mask].unsqueeze(0),
        predict_index=predictors[rows, cols],
        rows=rows,
        cols=cols,
    )


def scatter_scored(
    values: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, shape: tuple[int, int]
) -> torch.Tensor:
    """A ``shape`` float32 tensor of zeros with ``values`` at ``(rows, cols)`` (keeps grad).

    Shape: ``(K,)`` -> ``(B, R)``.
    """
    out = torch.zeros(shape, dtype=torch.float32, device=values.device)
    return out.index_put((rows, cols), values.float())


def pad_responses(values: torch.Tensor, response_length: int) -> torch.Tensor:
    """Right-pad ``(B, R')`` outputs of a trimmed batch with zeros back to ``(B, R)``."""
    missing = response_length - values.shape[1]
    if missing == 0:
        return values
    return torch.nn.functional.pad(values, (0, missing))
