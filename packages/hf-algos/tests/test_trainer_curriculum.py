"""GRPO on a ``chain_sum`` curriculum end to end on Ray: levels logged every step, and a run
stopped at step 2 and resumed trains on the same prompts at the same levels as an
uninterrupted one; validation stays a fixed ``reasoning_gym:`` spec alongside."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer
from hf_protocol import DataProto, fields

from .trainer_helpers import comparable

pytestmark = pytest.mark.timeout(300)

VAL_SPEC = (
    "reasoning_gym:chain_sum?size=4&seed=1000&min_terms=3&max_terms=3&min_digits=1&max_digits=1"
)
"""Held-out rows at the target difficulty: three terms."""


class RecordingTrainer(PPOTrainer):
    """The real GRPO trainer, recording each step's prompts as they come from the loader."""

    def __init__(self, config: RLConfig) -> None:
        super().__init__(config)
        self.prompts: list[list[str]] = []

    def next_batch(self) -> Any:
        batch = super().next_batch()
        assert isinstance(batch, DataProto)
        self.prompts.append([p[0]["content"] for p in batch.non_tensor_batch[fields.RAW_PROMPT]])
        return batch


def overrides(model: Path, root: Path, *extra: str) -> list[str]:
    """GRPO, 4 prompts x 2 samples a step; the curriculum starts at two terms and, with a
    threshold of 0, moves up one term after each step (the window is one step's 8 samples)."""
    return [
        f"actor.engine.model.path={model}",
        "data.curriculum.task=chain_sum",
        "data.curriculum.start={num_terms: 0, num_digits: 0}",
        "data.curriculum.advance=[num_terms]",
        "data.curriculum.max_levels={num_terms: 2}",
        "data.curriculum.threshold=0.0",
        "data.curriculum.window=8",
        f"data.val_files=['{VAL_SPEC}']",
        "data.max_prompt_length=96",
        "data.train_batch_size=4",
        "rollout.n=2",
        "rollout.max_new_tokens=4",
        "actor.ppo_mini_batch_size=4",
        "actor.engine.micro_batch.micro_batch_size=4",
        "trainer.total_training_steps=3",
        "trainer.test_freq=3",
        "trainer.loggers=[jsonl]",
        "trainer.progress_bar=false",
        f"trainer.log_dir={root / 'logs'}",
        "reward.num_workers=1",
        *extra,
    ]


def run(overrides: list[str]) -> tuple[list[dict[str, float]], list[list[str]]]:
    torch.set_num_threads(1)
    with RecordingTrainer(load_config(RLConfig, overrides=overrides)) as trainer:
        return trainer.fit(), trainer.prompts


def test_a_resumed_curriculum_run_trains_on_the_same_rows_at_the_same_levels(
    ray_session: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    full, full_prompts = run(
        overrides(
            tiny_model_dir,
            tmp_path,
            "trainer.save_freq=2",
            f"trainer.checkpoint_dir={tmp_path / 'a'}",
            "trainer.resume_mode=disable",
        )
    )
    assert [m["curriculum/num_terms"] for m in full] == [2.0, 3.0, 4.0]
    assert [m["curriculum/advanced"] for m in full] == [1.0, 1.0, 0.0]  # max level 2: 4 terms
    operators = [{p.count("+") + p.count("-") for p in step} for step in full_prompts]
    assert operators == [{1}, {2}, {3}]  # two, three, four terms
    assert "val/accuracy" in full[2] and "curriculum/accuracy" in full[0]
    resumed, resumed_prompts = run(
        overrides(
            tiny_model_dir,
            tmp_path,
            "trainer.resume_mode=path",
            f"trainer.resume_from={tmp_path / 'a' / 'global_step_2'}",
            f"trainer.checkpoint_dir={tmp_path / 'b'}",
        )
    )
    assert resumed_prompts == full_prompts[2:]
    assert len(resumed) == 1 and comparable(resumed[0]) == comparable(full[2])
