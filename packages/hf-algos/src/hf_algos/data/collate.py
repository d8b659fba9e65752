"""Turning tokenized rows into a left-padded prompt DataProto (the data loader's output)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from hf_protocol import DataProto, fields, left_pad

NON_TENSOR_KEYS: tuple[str, ...] = (
    fields.RAW_PROMPT,
    fields.DATA_SOURCE,
    fields.REWARD_MODEL,
    fields.EXTRA_INFO,
)
"""Row fields carried into ``non_tensor_batch`` unchanged (``uid`` is added per prompt)."""

COLUMNS = "dataset_columns"
"""Non-tensor key of each row's other dataset columns (``{name: value}``, e.g. TRL's
``solution``): they reach reward functions by name, as TRL passes dataset columns."""


def collate_to_dataproto(
    rows: Sequence[Mapping[str, Any]], pad_token_id: int, max_prompt_length: int
) -> DataProto:
    """A prompt batch: rows with ``input_ids`` (token list) and the dataset fields.

    Tensors ``input_ids``, ``attention_mask``, ``position_ids`` of shape
    ``(B, max_prompt_length)``, left-padded with ``pad_token_id``. Non-tensors
    ``raw_prompt``, ``data_source``, ``reward_model``, ``extra_info`` (``None`` where a row
    lacks one), :data:`COLUMNS` (each row's other columns as a dict) and ``uid``, a fresh
    unique id per prompt (rows repeated for sampling share it).
    """
    if not rows:
        raise ValueError("collate_to_dataproto got no rows; a batch needs at least one")
    prompts = left_pad([row[fields.INPUT_IDS] for row in rows], pad_token_id, max_prompt_length)
    non_tensors: dict[str, list[Any]] = {
        key: [row.get(key) for row in rows] for key in NON_TENSOR_KEYS
    }
    known = {*NON_TENSOR_KEYS, fields.INPUT_IDS}
    non_tensors[COLUMNS] = [{k: v for k, v in row.items() if k not in known} for row in rows]
    non_tensors[fields.UID] = [str(uuid.uuid4()) for _ in rows]
    return DataProto.from_dict(
        tensors={
            fields.INPUT_IDS: prompts.input_ids,
            fields.ATTENTION_MASK: prompts.attention_mask,
            fields.POSITION_IDS: prompts.position_ids,
        },
        non_tensors=non_tensors,
    )
