"""Turning tokenized rows into a left-padded prompt DataProto (the data loader's output)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hf_protocol import DataProto

NON_TENSOR_KEYS: tuple[str, ...] = ("raw_prompt", "data_source", "reward_model", "extra_info")
"""Row fields carried into ``non_tensor_batch`` unchanged (``uid`` is added per prompt)."""


def left_pad(
    sequences: Sequence[Sequence[int]], pad_token_id: int, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to ``length``; return ``(ids, mask)``, each ``(B, length)`` int64.

    Raises if a sequence is longer than ``length``.
    """
    ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.int64)
    mask = torch.zeros((len(sequences), length), dtype=torch.int64)
    for row, tokens in enumerate(sequences):
        if len(tokens) > length:
            raise ValueError(
                f"row {row} has {len(tokens)} tokens, more than the padded length {length}; "
                f"raise max_prompt_length or filter long prompts first."
            )
        if tokens:
            ids[row, length - len(tokens) :] = torch.as_tensor(list(tokens), dtype=torch.int64)
            mask[row, length - len(tokens) :] = 1
    return ids, mask


def right_pad(
    sequences: Sequence[Sequence[int]], pad_token_id: int, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists to ``length``; return ``(ids, mask)``, each ``(B, length)`` int64."""
    ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.int64)
    mask = torch.zeros((len(sequences), length), dtype=torch.int64)
    for row, tokens in enumerate(sequences):
        if len(tokens) > length:
            raise ValueError(
                f"row {row} has {len(tokens)} tokens, more than the padded length {length}"
            )
        if tokens:
            ids[row, : len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.int64)
            mask[row, : len(tokens)] = 1
    return ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting real tokens only (0 on left padding); shape as ``attention_mask``."""
    return (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)


def collate_to_dataproto(
    rows: Sequence[Mapping[str, Any]], pad_token_id: int, max_prompt_length: int
) -> DataProto:
    """A prompt batch: rows with ``input_ids`` (token list) and the dataset fields.

    Tensors ``input_ids``, ``attention_mask``, ``position_ids`` of shape
    ``(B, max_prompt_length)``, left-padded with ``pad_token_id``. Non-tensors
    ``raw_prompt``, ``data_source``, ``reward_model``, ``extra_info`` (``None`` where a row
    lacks one) and ``uid``, a fresh unique id per prompt (rows repeated for sampling share it).
    """
    if not rows:
        raise ValueError("collate_to_dataproto got no rows; a batch needs at least one")
    input_ids, attention_mask = left_pad(
        [row["input_ids"] for row in rows], pad_token_id, max_prompt_length
    )
    non_tensors: dict[str, list[Any]] = {
        key: [row.get(key) for row in rows] for key in NON_TENSOR_KEYS
    }
    non_tensors["uid"] = [str(uuid.uuid4()) for _ in rows]
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
        },
        non_tensors=non_tensors,
    )
