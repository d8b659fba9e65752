"""The batch layout: prompts left-padded, responses right-padded, one home for the padding.

Every package builds its prompt and prompt + response tensors with these functions, so a
data loader's batch, a rollout's output and an SFT / DPO batch line up column for column.

Shapes: ``B`` rows, ``P`` padded prompt width, ``R`` padded response width. All token,
mask and position tensors are int64.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from hf_protocol import fields
from hf_protocol.data_proto import DataProto


class PromptTensors(NamedTuple):
    """Left-padded prompts; a plain 3-tuple too (``ids, mask, pos = left_pad(...)``)."""

    input_ids: torch.Tensor
    """``(B, P)`` int64 token ids, the pad id before each prompt."""
    attention_mask: torch.Tensor
    """``(B, P)`` int64, 1 on real tokens."""
    position_ids: torch.Tensor
    """``(B, P)`` int64, :func:`position_ids_from_mask` of the mask."""


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting real tokens from 0; pads before the first token get 0.

    Shape: ``(B, L)`` -> ``(B, L)`` int64. After the last real token (right pads) the
    position stays at the last token's.
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def continue_position_ids(position_ids: torch.Tensor, width: int) -> torch.Tensor:
    """The next ``width`` positions after each row's last one: ``last + 1, ..., last + width``.

    Shape: ``(B, P)`` -> ``(B, width)``. For appending a response (or its padding) to
    tokens whose positions are given; with ``P == 0`` the positions start at 0.
    """
    rows = position_ids.shape[0]
    if position_ids.shape[1]:
        last = position_ids[:, -1:]
    else:
        last = torch.full((rows, 1), -1, dtype=torch.long, device=position_ids.device)
    return last + torch.arange(1, width + 1, device=position_ids.device).unsqueeze(0)


def _padded_width(rows: Sequence[Sequence[Any]], width: int | None) -> int:
    """``width``, or the longest row when None; a row longer than ``width`` is an error."""
    longest = max((len(row) for row in rows), default=0)
    if width is None:
        return longest
    if width < 0:
        raise ValueError(f"width={width} must be >= 0 (or None for the longest row)")
    if longest > width:
        row = next(index for index, values in enumerate(rows) if len(values) > width)
        raise ValueError(
            f"row {row} has {len(rows[row])} tokens, more than the padded length {width}; "
            "raise the length limit that sets it (e.g. max_prompt_length) or filter long "
            "rows first."
        )
    return width


def left_pad(
    token_lists: Sequence[Sequence[int]], pad_id: int, width: int | None = None
) -> PromptTensors:
    """Left-pad prompts into ``input_ids``, ``attention_mask``, ``position_ids``, each ``(B, P)``.

    ``P`` is ``width``, or the longest list when None (0 for no lists). A list longer than
    ``width`` is a ``ValueError`` naming its row and length.
    """
    width = _padded_width(token_lists, width)
    input_ids = torch.full((len(token_lists), width), pad_id, dtype=torch.int64)
    attention_mask = torch.zeros((len(token_lists), width), dtype=torch.int64)
    for row, tokens in enumerate(token_lists):
        if len(tokens):
            input_ids[row, width - len(tokens) :] = torch.as_tensor(list(tokens), dtype=torch.int64)
            attention_mask[row, width - len(tokens) :] = 1
    return PromptTensors(input_ids, attention_mask, position_ids_from_mask(attention_mask))


def right_pad(
    sequences: Sequence[Sequence[float]] | Sequence[Sequence[int]],
    pad_value: float,
    width: int | None = None,
    dtype: torch.dtype = torch.int64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad responses (or per-token values) into ``(values, mask)``, each ``(B, R)``.

    ``values`` has ``dtype`` (int64 token ids by default; float32 for log-probs), ``mask``
    is int64, 1 on real entries. ``R`` is ``width``, or the longest sequence when None
    (0 for no sequences). A sequence longer than ``width`` is a ``ValueError``.
    """
    width = _padded_width(sequences, width)
    values = torch.full((len(sequences), width), pad_value, dtype=dtype)
    mask = torch.zeros((len(sequences), width), dtype=torch.int64)
    for row, entries in enumerate(sequences):
        if len(entries):
            values[row, : len(entries)] = torch.as_tensor(list(entries), dtype=dtype)
            mask[row, : len(entries)] = 1
    return values, mask


def build_prompt_response_batch(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    pad_id: int,
    *,
    prompt_width: int | None = None,
    response_width: int | None = None,
    non_tensors: dict[str, Any] | None = None,
    meta_info: dict[str, Any] | None = None,
) -> DataProto:
    """A batch in the engines' layout from one prompt and one response token list per row.

    Tensors: ``prompts`` ``(B, P)`` left-padded; ``responses`` and ``response_mask``
    ``(B, R)`` right-padded; ``input_ids``, ``attention_mask``, ``position_ids``
    ``(B, P + R)`` of prompt + response, positions counted over the joined mask. ``P`` and
    ``R`` are the given widths, or the longest prompt / response when None; a longer row is
    a ``ValueError``. ``non_tensors`` and ``meta_info`` are passed to
    :meth:`DataProto.from_dict`. For batches of given text (SFT, DPO pairs, tests); a
    rollout's output is built by ``hf_rollout`` from its samples.
    """
    if len(prompt_ids) != len(response_ids):
        raise ValueError(
            f"{len(prompt_ids)} prompts but {len(response_ids)} responses; give one "
            "response per prompt (repeat a prompt for several responses)"
        )
    prompts = left_pad(prompt_ids, pad_id, prompt_width)
    responses, response_mask = right_pad(response_ids, pad_id, response_width)
    attention_mask = torch.cat([prompts.attention_mask, response_mask], dim=1)
    tensors = {
        fields.PROMPTS: prompts.input_ids,
        fields.RESPONSES: responses,
        fields.RESPONSE_MASK: response_mask,
        fields.INPUT_IDS: torch.cat([prompts.input_ids, responses], dim=1),
        fields.ATTENTION_MASK: attention_mask,
        fields.POSITION_IDS: position_ids_from_mask(attention_mask),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)
