"""``trainer.max_restarts``: a worker SIGKILLed mid-run; the trainer re-creates its groups,
resumes from the last checkpoint and ends exactly as an uninterrupted run."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_algos.checkpoint import CheckpointManager
from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer, RestartsExhaustedError
from hf_algos.trainers.lifecycle.trainer import Metrics
from hf_controller.errors import WorkerGroupError
from hf_protocol import DataProto

from .trainer_helpers import common_overrides, comparable, task_files

pytestmark = pytest.mark.timeout(600)


class KillingTrainer(PPOTrainer):
    """The real PPO trainer, whose training group's rank ``rank`` is SIGKILLed at the
    points ``kills`` names, in order: ``("update", k)`` right before the actor update of
    step k, ``("save", k)`` right before step k's checkpoint is saved."""

    def __init__(self, config: RLConfig, kills: list[tuple[str, int]], rank: int = 1) -> None:
        self.kills, self.rank = list(kills), rank
        self.killed: list[int] = []
        super().__init__(config)

    def worker_pid(self, rank: int) -> int:
        """The pid of ``rank`` of the (fused) training group, asked from the worker."""
        import ray

        group: Any = self.roles.owned[0]
        return int(ray.get(group.workers[rank]._hf_process_info.remote())["pid"])

    def _maybe_kill(self, point: str) -> None:
        if self.kills and self.kills[0] == (point, self.global_step):
            self.kills.pop(0)
            pid = self.worker_pid(self.rank)
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)

    def update(self, batch: DataProto, metrics: Metrics, timing: dict[str, float]) -> None:
        self._maybe_kill("update")
        super().update(batch, metrics, timing)

    def save_checkpoint(self) -> Path:
        self._maybe_kill("save")
        return super().save_checkpoint()


def overrides(model: Path, root: Path, name: str, restarts: int) -> list[str]:
    train, _ = task_files(root)
    return [
        *common_overrides(model, root, train, steps=3),
        "trainer.n_workers=2",
        "trainer.save_freq=1",
        "trainer.resume_mode=disable",
        f"trainer.checkpoint_dir={root / name}",
        f"trainer.max_restarts={restarts}",
    ]


def test_a_killed_worker_is_replaced_and_the_run_ends_as_an_uninterrupted_one(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    torch.set_num_threads(1)
    config = load_config(RLConfig, overrides=overrides(tiny_model_dir, tmp_path, "a", 0))
    with PPOTrainer(config) as trainer:
        clean = trainer.fit()
    config = load_config(RLConfig, overrides=overrides(tiny_model_dir, tmp_path, "b", 2))
    with KillingTrainer(config, [("update", 2)]) as trainer:
        first_pids = {trainer.worker_pid(rank) for rank in (0, 1)}
        restarted = trainer.fit()
        assert trainer.restarts == 1 and len(trainer.killed) == 1
        # new processes: the groups were re-created, not reused
        assert first_pids.isdisjoint({trainer.worker_pid(rank) for rank in (0, 1)})
    assert [m["training/global_step"] for m in restarted] == [1.0, 2.0, 3.0]
    for step, (a, b) in enumerate(zip(clean, restarted, strict=True), start=1):
        assert comparable(a) == comparable(b), f"step {step} differs after the restart"


def test_restarts_run_out_with_a_named_error(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    torch.set_num_threads(1)
    # no restarts allowed: the group's own error, naming group, rank and method (the dead
    # rank's, or a live rank's whose collective lost its peer, whichever is seen first)
    config = load_config(RLConfig, overrides=overrides(tiny_model_dir, tmp_path, "a", 0))
    with (
        KillingTrainer(config, [("update", 1)]) as trainer,
        pytest.raises(WorkerGroupError) as died,
    ):
        trainer.fit()
    assert "_train.actor rank" in str(died.value) and "update_actor" in str(died.value)
    # one restart allowed: a worker dies in step 1 (no checkpoint yet: the restart goes back
    # to the start), then again while step 1's checkpoint is being saved
    config = load_config(RLConfig, overrides=overrides(tiny_model_dir, tmp_path, "b", 1))
    with KillingTrainer(config, [("update", 1), ("save", 1)]) as trainer:
        with pytest.raises(RestartsExhaustedError, match=r"all 1 of its restarts.*max_restarts=1"):
            trainer.fit()
        assert trainer.restarts == 1 and len(trainer.killed) == 2
    # the save a worker died in never became a checkpoint
    assert CheckpointManager(tmp_path / "b").latest() is None
    assert not (tmp_path / "b" / "global_step_1").exists()
