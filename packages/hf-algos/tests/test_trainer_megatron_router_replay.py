"""GRPO with ``actor.router_replay`` on the Megatron engine with 2 expert-parallel ranks
(2 gloo CPU workers on Ray), a tiny Qwen3-MoE, a bf16 rollout: the rollout's recorded
expert choices reach the Megatron actor's forwards, which then agree with the rollout
better than its own routing does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer

from .trainer_helpers import assert_finite, common_overrides, task_files

pytestmark = [pytest.mark.second_lane, pytest.mark.timeout(600)]

METRICS = ("actor/pg_loss", "actor/grad_norm", "rollout_correction/kl_k3")


def _run(model: Path, root: Path, replay: bool) -> list[dict[str, float]]:
    """A 1-step GRPO run with the actor on Megatron EP=2 over 2 workers."""
    train, _ = task_files(root)
    overrides = [
        *common_overrides(model, root, train, steps=1),
        "rollout.dtype=bfloat16",
        f"actor.router_replay={str(replay).lower()}",
        "actor.old_log_probs_from_update=false",  # the separate old-log-prob forward
        "algorithm.rollout_correction.mode=tis",
        "trainer.n_workers=2",
        "actor.engine.backend=megatron",
        "actor.engine.megatron.expert_model_parallel_size=2",
        "actor.engine.micro_batch.micro_batch_size=2",
        "trainer.resume_mode=disable",
        f"trainer.checkpoint_dir={root / 'ckpt'}",
    ]
    torch.set_num_threads(1)
    with PPOTrainer(load_config(RLConfig, overrides=overrides)) as trainer:
        return trainer.fit()


def test_megatron_expert_parallel_actor_replays_the_rollout_routing(
    ray_session: Any, toy_task_scored: str, moe_model_dir: Path, tmp_path: Path
) -> None:
    own = _run(moe_model_dir, tmp_path / "own", replay=False)
    replayed = _run(moe_model_dir, tmp_path / "replay", replay=True)
    assert_finite(own, METRICS)
    assert_finite(replayed, METRICS)
    gap_own, gap_replayed = (
        own[0]["rollout_correction/kl_k3"],
        replayed[0]["rollout_correction/kl_k3"],
    )
    print(f"rollout-vs-actor KL (k3): own routing {gap_own:.3g}, replayed {gap_replayed:.3g}")
    # The same rollout (same seed and weights): only the actor's routing differs. Replaying
    # the bf16 rollout's expert choices removes the ones bf16 flipped, so the gap shrinks.
    assert 0 < gap_replayed < 0.5 * gap_own
