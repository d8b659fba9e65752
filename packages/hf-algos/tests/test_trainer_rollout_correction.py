"""GRPO with ``algorithm.rollout_correction.mode=tis`` end to end (workers in the driver):
the correction's metrics are logged every step and the run stays finite."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer

from .trainer_helpers import assert_finite, common_overrides, task_files

pytestmark = pytest.mark.timeout(600)

CORRECTION_METRICS = (
    "rollout_correction/kl_k1",
    "rollout_correction/kl_k3",
    "rollout_correction/ratio_mean",
    "rollout_correction/ratio_max",
    "rollout_correction/weight_mean",
    "rollout_correction/clipped_frac",
    "actor/pg_loss",
    "actor/grad_norm",
)


def test_grpo_with_truncated_importance_sampling(
    toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    torch.set_num_threads(1)
    train, _ = task_files(tmp_path)
    config = load_config(
        RLConfig,
        overrides=[
            *common_overrides(tiny_model_dir, tmp_path, train, steps=2),
            "algorithm.rollout_correction.mode=tis",
            "algorithm.rollout_correction.rollout_is_cap=1.5",
            "trainer.backend=local",
            "trainer.resume_mode=disable",
            f"trainer.checkpoint_dir={tmp_path / 'ckpt'}",
        ],
    )
    with PPOTrainer(config) as trainer:
        history = trainer.fit()
    assert len(history) == 2
    assert_finite(history, CORRECTION_METRICS)
    for metrics in history:
        # the same model samples and scores: the ratios sit near 1, the k3 KL is >= 0
        assert metrics["rollout_correction/kl_k3"] >= 0.0
        assert 0.0 <= metrics["rollout_correction/clipped_frac"] <= 1.0
        assert metrics["rollout_correction/weight_mean"] <= 1.5
