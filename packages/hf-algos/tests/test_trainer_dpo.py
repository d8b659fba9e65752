"""DPO (offline pairs, on Ray) with exact resume; online DPO and SFT for a few steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hf_algos.config import DPOConfig, SFTConfig, load_config
from hf_algos.data import write_rows
from hf_algos.trainers import DPOTrainer, SFTTrainer

from .toy_task import make_sort_digits_rows
from .trainer_helpers import assert_finite, common_overrides, comparable, task_files

pytestmark = pytest.mark.timeout(600)


def pair_files(root: Path) -> tuple[Path, Path]:
    """Preference pairs of the toy task: the sorted digits beat the digits copied unsorted."""

    def pairs(n: int, seed: int) -> list[dict[str, Any]]:
        rows = make_sort_digits_rows(n, length=3, seed=seed)
        return [
            {
                "prompt": r["prompt"],
                "chosen": r["reward_model"]["ground_truth"],
                "rejected": r["prompt"][:-1],
                "response": r["reward_model"]["ground_truth"],
            }
            for r in rows
        ]

    return write_rows(pairs(8, 0), root / "pairs.jsonl"), write_rows(pairs(4, 1), root / "vp.jsonl")


def dpo_overrides(model: Path, root: Path, train: Path, val: Path) -> list[str]:
    return [
        f"actor.engine.model.path={model}",
        f"data.train_files=[{train}]",
        f"data.val_files=[{val}]",
        "data.train_batch_size=4",
        # one optimizer step per training step: the first step's loss is all at the reference
        "dpo.mini_batch_size=4",
        "actor.engine.micro_batch.micro_batch_size=2",
        "actor.engine.optim.lr=1e-3",
        "trainer.total_training_steps=3",
        "trainer.test_freq=3",
        "trainer.loggers=[jsonl]",
        "trainer.progress_bar=false",
        f"trainer.log_dir={root / 'logs'}",
    ]


def run_dpo(overrides: list[str]) -> list[dict[str, float]]:
    torch.set_num_threads(1)
    with DPOTrainer(load_config(DPOConfig, overrides=overrides)) as trainer:
        return trainer.fit()


def test_offline_dpo_learns_and_resumes_exactly(
    ray_session: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    train, val = pair_files(tmp_path)
    base = dpo_overrides(tiny_model_dir, tmp_path, train, val)
    full = run_dpo(
        [
            *base,
            "trainer.save_freq=2",
            f"trainer.checkpoint_dir={tmp_path / 'a'}",
            "trainer.resume_mode=disable",
        ]
    )
    resumed = run_dpo(
        [
            *base,
            "trainer.resume_mode=path",
            f"trainer.resume_from={tmp_path / 'a' / 'global_step_2'}",
            f"trainer.checkpoint_dir={tmp_path / 'b'}",
        ]
    )
    names = ["actor/dpo_loss", "actor/reward_margin", "actor/grad_norm", "timing_s/update_actor"]
    assert_finite(full, names)
    # the first step starts at the reference: loss log(2), margin 0
    assert full[0]["actor/dpo_loss"] == pytest.approx(0.6931, abs=1e-3)
    assert full[2]["actor/reward_margin"] > 0
    assert "val/dpo/reward_accuracy" in full[2]
    assert comparable(resumed[0]) == comparable(full[2])


def test_online_dpo_and_sft_run(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    train, _ = task_files(tmp_path)
    online = [
        *common_overrides(tiny_model_dir, tmp_path, train, steps=2)[:4],
        "dpo.online=true",
        "rollout.n=4",
        "dpo.mini_batch_size=2",
        "actor.engine.micro_batch.micro_batch_size=2",
        "rollout.max_new_tokens=6",
        "trainer.total_training_steps=2",
        "trainer.loggers=[jsonl]",
        "trainer.progress_bar=false",
        f"trainer.log_dir={tmp_path / 'logs'}",
        f"trainer.checkpoint_dir={tmp_path / 'online'}",
        "reward.num_workers=1",
    ]
    history = run_dpo(online)
    assert len(history) == 2
    assert_finite(history, ["dpo/pairs", "online/critic/score/mean", "timing_s/gen"])
    for metrics in history:  # a step trains only when some prompt's samples scored apart
        assert ("actor/dpo_loss" in metrics) == (metrics["dpo/pairs"] > 0)

    sft_train, _ = pair_files(tmp_path)
    sft = load_config(
        SFTConfig,
        overrides=[
            f"actor.engine.model.path={tiny_model_dir}",
            f"data.train_files=[{sft_train}]",
            f"data.val_files=[{sft_train}]",
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4",
            "actor.engine.micro_batch.micro_batch_size=4",
            "actor.engine.optim.lr=1e-2",
            "trainer.total_training_steps=4",
            "trainer.test_freq=4",
            "trainer.val_before_train=true",
            "trainer.backend=local",
            "trainer.loggers=[]",
            "trainer.progress_bar=false",
            f"trainer.checkpoint_dir={tmp_path / 'sft'}",
        ],
    )
    with SFTTrainer(sft) as trainer:
        before = trainer.validate()["val/sft_nll"]
        steps = trainer.fit()
    assert_finite(steps, ["actor/sft_nll", "actor/grad_norm"])
    assert steps[-1]["val/sft_nll"] < before
