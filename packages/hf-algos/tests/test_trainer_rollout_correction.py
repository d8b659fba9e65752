"""GRPO with ``algorithm.rollout_correction.mode=tis`` end to end (workers in the driver):
the correction's metrics are logged every step and the run stays finite."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer
from hf_algos.trainers.ppo.trainer import old_log_probs_source

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


def test_old_log_probs_from_the_update_equal_a_separate_forward(
    toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """One optimizer step per batch: the step that takes old_log_probs from the update's own
    forward (the default) trains exactly like the one that recomputes them first, rollout
    correction included, and skips that forward."""
    torch.set_num_threads(1)
    train, _ = task_files(tmp_path)
    runs = {}
    for from_update in (True, False):
        root = tmp_path / str(from_update)
        config = load_config(
            RLConfig,
            overrides=[
                *common_overrides(tiny_model_dir, root, train, steps=2),
                "actor.ppo_mini_batch_size=8",  # the whole batch (4 prompts x 2): one step
                "actor.engine.micro_batch.micro_batch_size=4",  # two micro-batches
                f"actor.old_log_probs_from_update={str(from_update).lower()}",
                "algorithm.rollout_correction.mode=tis",
                "algorithm.rollout_correction.rollout_is_cap=1.5",
                "trainer.backend=local",
                "trainer.resume_mode=disable",
            ],
        )
        with PPOTrainer(config) as trainer:
            runs[from_update] = trainer.fit()
    fused, separate = runs[True], runs[False]
    for step, (one, other) in enumerate(zip(fused, separate, strict=True), start=1):
        assert "timing_s/old_log_prob" not in one and "timing_s/old_log_prob" in other
        for name in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"):
            assert one[name] == pytest.approx(other[name], rel=1e-5, abs=1e-7), (step, name)
        assert one["actor/ppo_kl"] == 0.0
        for name in ("rollout_correction/kl_k3", "rollout_correction/weight_mean"):
            # the driver averages over the batch, the loss over its two micro-batches
            assert one[name] == pytest.approx(other[name], rel=0.05, abs=1e-6), (step, name)


def test_old_log_probs_source_is_chosen_once_from_the_config(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    train, _ = task_files(tmp_path)
    base = common_overrides(tiny_model_dir, tmp_path, train, steps=1)  # 4 prompts x 2

    def source(*overrides: str) -> str:
        return old_log_probs_source(load_config(RLConfig, overrides=[*base, *overrides]))

    one_step = "actor.ppo_mini_batch_size=8"
    assert source(one_step) == "update"
    assert source("actor.ppo_mini_batch_size=16") == "update"  # room to spare
    assert source(one_step, "data.train_batch_size=5") == "actor"  # 10 rows: two mini-batches
    assert source() == "actor"  # the helpers' mini-batch of 4: two steps
    assert source(one_step, "actor.ppo_epochs=2") == "actor"
    assert source(one_step, "actor.use_rollout_log_probs=true") == "rollout"
    assert source("actor.use_rollout_log_probs=true") == "rollout"
    assert source(one_step, "actor.old_log_probs_from_update=false") == "actor"
    # the reward's KL penalty reads old_log_probs before the update
    assert source(one_step, "algorithm.use_kl_in_reward=true") == "actor"
