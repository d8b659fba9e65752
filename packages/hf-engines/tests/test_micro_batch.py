"""Micro-batch splitting by rows and by token budget keeps row order."""

from __future__ import annotations

import pytest
import torch

from hf_engines import MicroBatchConfig, split_by_size, split_by_token_budget, split_micro_batches
from hf_engines.config import AUTO_MICRO_BATCH_TOKENS
from hf_engines.testing import make_toy_batch
from hf_protocol import DataProto


def test_split_by_size() -> None:
    assert split_by_size(5, 2) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match=r"micro_batch_size=0"):
        split_by_size(5, 0)


def test_token_budget_packs_in_order() -> None:
    assert split_by_token_budget([4, 3, 5, 1, 6], 8) == [[0, 1], [2, 3], [4]]
    assert split_by_token_budget([8, 8], 8) == [[0], [1]]


def test_row_over_budget_names_the_row_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"row 1 has 9 tokens.*max_tokens=8.*at least.*9"):
        split_by_token_budget([3, 9], 8)


@pytest.mark.parametrize(
    "config", [MicroBatchConfig(micro_batch_size=3), MicroBatchConfig(max_tokens=16)]
)
def test_micro_batches_concatenate_to_the_batch(config: MicroBatchConfig) -> None:
    batch = make_toy_batch(7, seed=1)
    parts = split_micro_batches(batch, config)
    assert len(parts) > 1
    joined = DataProto.concat(parts)
    for key, value in batch.batch.items():
        assert torch.equal(joined.batch[key], value), key
    if config.max_tokens is not None:
        assert all(int(p.batch["attention_mask"].sum()) <= 16 for p in parts)


def test_default_is_a_token_budget_raised_to_the_longest_row() -> None:
    batch = make_toy_batch(7, prompt_length=6, response_length=5, seed=1)
    assert split_micro_batches(batch, MicroBatchConfig()) == [batch]  # 7 short rows: one
    long = make_toy_batch(3, prompt_length=AUTO_MICRO_BATCH_TOKENS, response_length=8, seed=2)
    long.batch["attention_mask"][:] = 1  # every row longer than the budget alone
    parts = split_micro_batches(long, MicroBatchConfig())
    assert [len(p) for p in parts] == [1, 1, 1]  # one row each, none refused
