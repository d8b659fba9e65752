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
from hf_engines.workers import count_mini_batches, shuffle_seed, split_mini_batches
from hf_engines.workers.reward_model import place_on_last_token, with_score_position


def test_mini_batches_cut_each_shard_the_same_number_of_times() -> None:
    assert count_mini_batches(8, 4) == 2
    assert count_mini_batches(9, 4) == 3  # the last global mini-batch is short
    parts = split_mini_batches(make_toy_batch(5), 2)
    assert [len(p) for p in parts] == [3, 2]
    shuffled = split_mini_batches(make_toy_batch(4), 2, torch.tensor([3, 2, 1, 0]))
    expected = make_toy_batch(4).batch["input_ids"].flip(0)
    assert torch.equal(torch.cat([p.batch["input_ids"] for p in shuffled]), expected)
    with pytest.raises(ValueError, match="fewer than the 3 mini-batches"):
        split_mini_batches(make_toy_batch(2), 3)


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
    config = ActorConfig(engine=lm, ppo_mini_batch_size=3)
    with pytest.raises(ConfigurationError, match="not divisible by the data-parallel size 2"):
        config.validate_for(2)


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
