"""A cosine schedule without ``optim.total_steps`` ends at the run's last optimizer step:
the trainer counts them from its steps, rows, mini-batches and epochs."""

from __future__ import annotations

from pathlib import Path

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers.roles.workers import optimizer_steps, with_run_length

BASE = [
    "+actor.engine.model.hf_config.model_type=llama",
    f"data.tokenizer_path={Path(__file__).parent}",
    "rollout.n=4",
    "actor.ppo_mini_batch_size=16",
]


def test_optimizer_steps_count_mini_batches_and_epochs() -> None:
    assert optimizer_steps(300, rows=256, mini_batch_rows=256) == 300
    assert optimizer_steps(10, rows=64, mini_batch_rows=16, epochs=2) == 80
    assert optimizer_steps(10, rows=7, mini_batch_rows=4) == 20  # 4 + 3 rows
    assert optimizer_steps(5, rows=10, mini_batch_rows=4, row_group_size=2) == 15  # pairs


def test_the_schedule_takes_the_run_length_unless_given() -> None:
    cosine = ["actor.engine.optim.schedule=cosine", "actor.engine.optim.warmup_steps=5"]
    config = load_config(RLConfig, overrides=[*BASE, *cosine])
    assert config.actor.engine.optim.total_steps is None  # accepted: the trainer fills it
    assert with_run_length(config.actor.engine, 80).optim.total_steps == 80
    assert with_run_length(config.actor.engine, 3).optim.total_steps == 6  # past the warm-up
    assert with_run_length(config.actor.engine, None) is config.actor.engine
    given = load_config(RLConfig, overrides=[*BASE, *cosine, "actor.engine.optim.total_steps=40"])
    assert with_run_length(given.actor.engine, 80).optim.total_steps == 40
