"""The workers' pure helpers and config checks (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_controller import ConfigurationError
from hf_engines import (
    ActorConfig,
    CriticConfig,
    EngineConfig,
    ModelConfig,
    ReferenceWorker,
    RewardModelWorker,
)
from hf_engines.testing import make_toy_batch
from hf_engines.workers import (
    FILLER_ROWS,
    count_mini_batches,
    filler_rows,
    mini_batch_ranges,
    shuffle_seed,
    split_mini_batches,
)
from hf_engines.workers.reward_model import place_on_last_token, with_score_position
from hf_engines.workers.updates import group_permutation


def test_mini_batches_are_the_same_global_rows_for_any_worker_count() -> None:
    assert count_mini_batches(8, 4) == 2
    assert count_mini_batches(9, 4) == 3  # the last global mini-batch is short
    assert mini_batch_ranges(7, 4) == [(0, 4), (4, 7)]
    assert mini_batch_ranges(9, 4) == [(0, 3), (3, 6), (6, 9)]  # balanced, no divisor
    assert mini_batch_ranges(5, 8) == [(0, 5)]  # larger than the step: one mini-batch
    assert mini_batch_ranges(10, 4, row_group_size=2) == [(0, 4), (4, 8), (8, 10)]  # pairs
    assert mini_batch_ranges(10, 6, row_group_size=2) == [(0, 6), (6, 10)]
    with pytest.raises(ValueError, match="not whole groups of row_group_size=2"):
        mini_batch_ranges(7, 4, row_group_size=2)
    order = group_permutation(6, 2, torch.Generator().manual_seed(0))
    assert sorted(order.tolist()) == list(range(6))
    assert all(int(order[i]) % 2 == 0 and order[i + 1] == order[i] + 1 for i in (0, 2, 4))
    batch = make_toy_batch(7)
    ranges = mini_batch_ranges(7, 4)
    ids = batch.batch["input_ids"]
    for world in (1, 2, 3):
        shards = batch.chunk(world)
        starts = [sum(len(s) for s in shards[:r]) for r in range(world)]
        parts = [
            split_mini_batches(s, start, ranges) for s, start in zip(shards, starts, strict=True)
        ]
        for index, (start, stop) in enumerate(ranges):
            real = [p[index] for p in parts if p[index].batch["response_mask"].sum() > 0]
            joined = torch.cat([p.batch["input_ids"] for p in real])
            assert torch.equal(joined, ids[start:stop]), (world, index)


def test_an_empty_part_becomes_a_filler_without_response_tokens() -> None:
    batch = make_toy_batch(7)
    shard = batch.chunk(3)[2]  # rows 5, 6: nothing of mini-batch 0 = rows 0..3
    first, second = split_mini_batches(shard, 5, mini_batch_ranges(7, 4))
    assert len(first) == FILLER_ROWS and first.batch["response_mask"].sum() == 0
    assert torch.equal(first.batch["input_ids"], shard.batch["input_ids"][:FILLER_ROWS])
    assert shard.batch["response_mask"].sum() > 0  # the shard itself is untouched
    assert torch.equal(second.batch["input_ids"], shard.batch["input_ids"])
    assert len(filler_rows(batch.slice(0, 1))) == 1
    shuffled = split_mini_batches(make_toy_batch(4), 0, [(0, 4)], torch.tensor([3, 2, 1, 0]))
    expected = make_toy_batch(4).batch["input_ids"].flip(0)
    assert torch.equal(shuffled[0].batch["input_ids"], expected)


def test_score_goes_on_the_last_response_token() -> None:
    values = torch.arange(12, dtype=torch.float32).view(3, 4)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    expected = torch.tensor([[0, 1.0, 0, 0], [0, 0, 0, 7.0], [0, 0, 0, 0]])
    assert torch.equal(place_on_last_token(values, mask), expected)


def test_score_position_follows_the_last_response_token() -> None:
    batch = make_toy_batch(3)
    longer = with_score_position(dict(batch.batch.items())).batch
    assert longer["input_ids"].shape == (3, 12) and longer["responses"].shape == (3, 6)
    old_mask = batch.batch["attention_mask"]
    # Exactly one more real token per row, right after its last response token.
    assert torch.equal(longer["attention_mask"].sum(-1), old_mask.sum(-1) + 1)
    for row in range(3):
        extra = int(old_mask[row].nonzero().max()) + 1
        assert longer["attention_mask"][row, extra] == 1
        assert longer["position_ids"][row, extra] == batch.batch["position_ids"][row, extra - 1] + 1
    assert torch.equal(longer["input_ids"][:, :-1], batch.batch["input_ids"])


def test_roles_check_the_model_head(tiny_models: dict[str, Path]) -> None:
    lm = EngineConfig(model=ModelConfig(path=str(tiny_models["llama"])))
    value = EngineConfig(model=ModelConfig(path=str(tiny_models["llama"]), head="value"))
    with pytest.raises(ConfigurationError, match=r"CriticWorker needs model\.head"):
        CriticConfig(engine=lm, ppo_mini_batch_size=2)
    with pytest.raises(ConfigurationError, match=r"ActorWorker needs model\.head"):
        ActorConfig(engine=value, ppo_mini_batch_size=2)
    with pytest.raises(ConfigurationError, match=r"RewardModelWorker needs model\.head"):
        RewardModelWorker(lm)
    with pytest.raises(ConfigurationError, match=r"ReferenceWorker needs model\.head"):
        ReferenceWorker(value)
    with pytest.raises(ConfigurationError, match="ppo_mini_batch_size=0"):
        ActorConfig(engine=lm, ppo_mini_batch_size=0)
    assert ActorConfig(engine=lm, ppo_mini_batch_size=3).ppo_mini_batch_size == 3  # any size


def test_engine_methods_before_init_model_name_the_fix(tiny_models: dict[str, Path]) -> None:
    worker = ReferenceWorker(EngineConfig(model=ModelConfig(path=str(tiny_models["llama"]))))
    with pytest.raises(RuntimeError, match="call init_model"):
        worker.compute_ref_log_prob(make_toy_batch(2))


def test_shuffle_seed_follows_the_optimizer_step() -> None:
    # A function of (seed, step, epoch) only: a resumed engine at step s reshuffles alike.
    assert shuffle_seed(5, 4, 1) == shuffle_seed(5, 4, 1)
    # Every update call advances the step by at least ppo_epochs: epochs never collide.
    ppo_epochs = 3
    seeds = [shuffle_seed(0, call * ppo_epochs, e) for call in range(4) for e in range(ppo_epochs)]
    assert len(set(seeds)) == len(seeds)
    assert shuffle_seed(1, 0, 0) != shuffle_seed(0, 0, 0)
