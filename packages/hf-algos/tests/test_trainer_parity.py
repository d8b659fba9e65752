"""GRPO in the trainer on Megatron TP=2 and PP=2 (2 gloo ranks, CPU) against 1-rank FSDP.

The same seed, task and model (the tiny random Llama, fp32) for a few steps: every step's
loss, gradient norm and mean reward agree within 1e-4 relative. The rollout samples each
prompt row from its own stream (seeded by the step and the row's index in the request), so
2 rollout workers draw exactly what 1 draws, and the steps can be compared one by one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer

from .trainer_helpers import common_overrides, task_files

pytestmark = [pytest.mark.second_lane, pytest.mark.timeout(1500)]

STEPS = 10
RTOL = 1e-4
ATOL = 1e-6  # for values that are 0 up to rounding (a step whose samples all score 0)
COMPARED = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean")
LAYOUTS = {
    "fsdp-1": ["trainer.n_workers=1"],
    "megatron-tp2": [
        "trainer.n_workers=2",
        "actor.engine.backend=megatron",
        "actor.engine.megatron.tensor_model_parallel_size=2",
    ],
    "megatron-pp2": [
        "trainer.n_workers=2",
        "actor.engine.backend=megatron",
        "actor.engine.megatron.pipeline_model_parallel_size=2",
    ],
}


def grpo_overrides(model: Path, root: Path) -> list[str]:
    """GRPO on the toy task: 4 prompts x 2 samples a step, sampled at temperature 1."""
    train, _ = task_files(root)
    return [
        *common_overrides(model, root, train, steps=STEPS),
        "algorithm.adv_estimator=grpo",
        # the untrained model mostly scores 0 (zero advantages): the entropy bonus gives
        # every step a non-zero gradient to agree on
        "actor.entropy_coeff=0.01",
        "actor.engine.micro_batch.micro_batch_size=2",
        "trainer.resume_mode=disable",
        "trainer.seed=7",
    ]


def run(overrides: list[str]) -> list[dict[str, float]]:
    """The per-step metrics of one run."""
    torch.set_num_threads(1)
    with PPOTrainer(load_config(RLConfig, overrides=overrides)) as trainer:
        return [{key: float(step[key]) for key in COMPARED} for step in trainer.fit()]


def relative_gaps(run: list[dict[str, float]], reference: list[dict[str, float]]) -> list[dict]:
    """Per step and metric: ``|a - b| / max(|b|, ATOL)``."""
    return [
        {key: abs(a[key] - b[key]) / max(abs(b[key]), ATOL) for key in COMPARED}
        for a, b in zip(run, reference, strict=True)
    ]


def test_grpo_on_megatron_tp2_and_pp2_matches_one_rank_fsdp(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    histories = {
        name: run([*grpo_overrides(tiny_model_dir, tmp_path / name), *extra])
        for name, extra in LAYOUTS.items()
    }
    (tmp_path / "parity.json").write_text(json.dumps(histories, indent=1))
    reference = histories["fsdp-1"]
    assert len(reference) == STEPS
    assert all(step["actor/grad_norm"] > 0 for step in reference)
    for name, history in histories.items():
        gaps = relative_gaps(history, reference)
        print(name, json.dumps(gaps))
        for step, (got, want) in enumerate(zip(history, reference, strict=True), start=1):
            for key in COMPARED:
                assert got[key] == pytest.approx(want[key], rel=RTOL, abs=ATOL), (name, step, key)
