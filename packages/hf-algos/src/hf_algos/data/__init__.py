"""Datasets and loaders: RL prompts, DPO preference pairs, SFT rows, reasoning-gym tasks, a
local character tokenizer.

Public names are imported on first use (``hf_algos._lazy``), so importing one light
submodule does not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_algos._lazy import lazy_exports

if TYPE_CHECKING:
    from hf_algos.data.collate import collate_to_dataproto
    from hf_algos.data.files import DataError, RowSource, read_rows, write_rows
    from hf_algos.data.loader import StatefulDataLoader
    from hf_algos.data.preference import (
        PreferenceDataset,
        PreferenceDatasetConfig,
        collate_preference_pairs,
    )
    from hf_algos.data.preference_pairs import build_preference_pairs, make_preference_batch
    from hf_algos.data.reasoning_gym import ReasoningGymSpec, reasoning_gym_rows
    from hf_algos.data.rl_dataset import RLDataset, RLDatasetConfig
    from hf_algos.data.sft import SFTDataset
    from hf_algos.data.tokenizer import CHAR_CHAT_TEMPLATE, build_char_tokenizer

_WHERE = {
    "CHAR_CHAT_TEMPLATE": "hf_algos.data.tokenizer",
    "DataError": "hf_algos.data.files",
    "PreferenceDataset": "hf_algos.data.preference",
    "PreferenceDatasetConfig": "hf_algos.data.preference",
    "RLDataset": "hf_algos.data.rl_dataset",
    "RLDatasetConfig": "hf_algos.data.rl_dataset",
    "ReasoningGymSpec": "hf_algos.data.reasoning_gym",
    "RowSource": "hf_algos.data.files",
    "SFTDataset": "hf_algos.data.sft",
    "StatefulDataLoader": "hf_algos.data.loader",
    "build_char_tokenizer": "hf_algos.data.tokenizer",
    "build_preference_pairs": "hf_algos.data.preference_pairs",
    "collate_preference_pairs": "hf_algos.data.preference",
    "collate_to_dataproto": "hf_algos.data.collate",
    "make_preference_batch": "hf_algos.data.preference_pairs",
    "read_rows": "hf_algos.data.files",
    "reasoning_gym_rows": "hf_algos.data.reasoning_gym",
    "write_rows": "hf_algos.data.files",
}

__all__ = [
    "CHAR_CHAT_TEMPLATE",
    "DataError",
    "PreferenceDataset",
    "PreferenceDatasetConfig",
    "RLDataset",
    "RLDatasetConfig",
    "ReasoningGymSpec",
    "RowSource",
    "SFTDataset",
    "StatefulDataLoader",
    "build_char_tokenizer",
    "build_preference_pairs",
    "collate_preference_pairs",
    "collate_to_dataproto",
    "make_preference_batch",
    "read_rows",
    "reasoning_gym_rows",
    "write_rows",
]
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
