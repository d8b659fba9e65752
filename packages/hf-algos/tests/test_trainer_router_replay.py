"""GRPO on a tiny Qwen3-MoE with ``actor.router_replay`` end to end (workers in the driver):
the rollout's recorded expert choices reach the actor's forwards (old log-probs and the
update), and only with the option on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer

from .trainer_helpers import common_overrides, task_files

pytestmark = pytest.mark.timeout(600)


def _run(model: Path, root: Path, replay: bool) -> float:
    """The first step's rollout-vs-actor KL (k3) of a 1-step GRPO run."""
    train, _ = task_files(root)
    config = load_config(
        RLConfig,
        overrides=[
            *common_overrides(model, root, train, steps=1),
            "rollout.dtype=bfloat16",
            f"actor.router_replay={str(replay).lower()}",
            "actor.old_log_probs_from_update=false",  # the separate old-log-prob forward
            "algorithm.rollout_correction.mode=tis",
            "trainer.backend=local",
            "trainer.resume_mode=disable",
            f"trainer.checkpoint_dir={root / 'ckpt'}",
        ],
    )
    with PPOTrainer(config) as trainer:
        history = trainer.fit()
    return history[0]["rollout_correction/kl_k3"]


def test_router_replay_reaches_the_actor_only_when_on(
    toy_task_scored: str, moe_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    from hf_engines.fsdp import engine as fsdp_engine

    real = fsdp_engine.replay_routing
    replayed_rows: list[int] = []

    @contextmanager
    def counting(model: Any, routed: torch.Tensor) -> Iterator[None]:
        replayed_rows.append(routed.shape[0])
        with real(model, routed):
            yield

    monkeypatch.setattr(fsdp_engine, "replay_routing", counting)
    own = _run(moe_model_dir, tmp_path / "own", replay=False)
    assert replayed_rows == []
    replayed = _run(moe_model_dir, tmp_path / "replay", replay=True)
    # 8 rows, micro-batches of 4: two forwards for the old log-probs, two in the update
    assert replayed_rows == [4, 4, 4, 4]
    # a bf16 rollout of the same model: replay removes the expert choices that bf16 flipped,
    # so the rollout-vs-actor gap does not grow (measured: 7.1e-4 without, 5.6e-5 with)
    assert 0 < replayed <= 1.5 * own
