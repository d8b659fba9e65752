"""Starting the training pool's worker processes early (the ``hybridflow`` command's way)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import ray

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer
from hf_algos.trainers.roles.placement import PoolLayout, start_workers_early, take_early_pool
from hf_controller import ConfigurationError, RayWorkerGroup

from .trainer_helpers import assert_finite, common_overrides, task_files

pytestmark = pytest.mark.timeout(600)


def _config(tmp_path: Path, model: Path) -> RLConfig:
    train, _ = task_files(tmp_path)
    return load_config(RLConfig, overrides=common_overrides(model, tmp_path, train, steps=2))


def test_the_trainer_builds_its_workers_in_the_early_processes(
    ray_session: Any, tiny_model_dir: Path, toy_task_scored: str, tmp_path: Path
) -> None:
    config = _config(tmp_path, tiny_model_dir)
    start_workers_early(PoolLayout.of(config.trainer))
    with PPOTrainer(config) as trainer:
        (group,) = [g for g in trainer.roles.owned if isinstance(g, RayWorkerGroup)]
        assert group._hosted  # the fused actor/rollout worker lives in the prestarted process
        history = trainer.fit()
    assert len(history) == 2
    assert_finite(history, ("actor/pg_loss", "critic/score/mean"))
    assert take_early_pool(config.trainer) is None  # taken once


def test_an_early_pool_of_another_layout_is_given_back(
    ray_session: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    trainer = _config(tmp_path, tiny_model_dir).trainer
    start_workers_early(PoolLayout.of(replace(trainer, n_workers=2)))
    start_workers_early(PoolLayout.of(trainer))  # a second call while one is pending: no-op
    assert take_early_pool(trainer) is None  # its layout was 2 workers, this one asks for 1
    early_groups = [
        group
        for group in ray.util.placement_group_table().values()
        if group["name"].startswith("hf_early_train")
    ]
    assert early_groups and all(group["state"] == "REMOVED" for group in early_groups)
    early = PoolLayout.of(trainer)
    start_workers_early(early)
    pool = take_early_pool(trainer)
    assert pool is not None and len(pool.take_hosts()) == 1
    pool.release()


def test_an_early_start_that_failed_raises_its_error_when_taken(
    ray_session: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two nodes on a one-node Ray: the early start's error (naming the nodes) surfaces in
    the driver when the trainer takes its pool, not a second, slower attempt."""
    trainer = replace(_config(tmp_path, tiny_model_dir).trainer, n_workers=2, nnodes=2)
    start_workers_early(PoolLayout.of(trainer))
    with pytest.raises(ConfigurationError, match="node"):
        take_early_pool(trainer)
    assert take_early_pool(trainer) is None  # the failed start is gone with its error
