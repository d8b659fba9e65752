"""Datasets and loaders: RL prompts, DPO preference pairs, SFT rows, a local character
tokenizer."""

from hf_algos.data.collate import collate_to_dataproto
from hf_algos.data.files import DataError, RowSource, read_rows, write_rows
from hf_algos.data.loader import StatefulDataLoader
from hf_algos.data.preference import (
    PreferenceDataset,
    PreferenceDatasetConfig,
    collate_preference_pairs,
)
from hf_algos.data.preference_pairs import build_preference_pairs, make_preference_batch
from hf_algos.data.rl_dataset import RLDataset, RLDatasetConfig
from hf_algos.data.sft import SFTDataset
from hf_algos.data.tokenizer import CHAR_CHAT_TEMPLATE, build_char_tokenizer

__all__ = [
    "CHAR_CHAT_TEMPLATE",
    "DataError",
    "PreferenceDataset",
    "PreferenceDatasetConfig",
    "RLDataset",
    "RLDatasetConfig",
    "RowSource",
    "SFTDataset",
    "StatefulDataLoader",
    "build_char_tokenizer",
    "build_preference_pairs",
    "collate_preference_pairs",
    "collate_to_dataproto",
    "make_preference_batch",
    "read_rows",
    "write_rows",
]
