"""Trainers on 2 and 3 workers (gloo on CPU), with row counts that do not divide evenly.

One step on N workers must equal the step on one worker: with deterministic samples
(``rollout.top_k=1`` picks the most likely token, so every worker count generates the same
responses) the update's loss and gradient norm and the updated weights agree with the
1-worker run, for the hybrid and the separate placement (weights over the direct channel).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from hf_algos.config import DPOConfig, RLConfig, load_config
from hf_algos.trainers import DPOTrainer, PPOTrainer

from .test_trainer_dpo import dpo_overrides, pair_files
from .trainer_helpers import assert_finite, common_overrides, task_files

pytestmark = pytest.mark.timeout(600)

# fp32 on CPU; the rows of a rank are computed in other batch shapes than on one worker, so
# the sums differ in the last bits only.
ATOL = 1e-5


def one_step(overrides: list[str], export_dir: Path) -> dict[str, float]:
    """Run one step, export the updated actor to ``export_dir``; return the step's metrics."""
    torch.set_num_threads(1)
    config = load_config(RLConfig, overrides=overrides)
    with PPOTrainer(config) as trainer:
        (metrics,) = trainer.fit()
        trainer.roles.actor.export_hf(str(export_dir))
    return metrics


def deterministic_step(model: Path, root: Path, train: Path) -> list[str]:
    """5 prompts x 1 response (5 rows: uneven on 2 and 3 workers) in two uneven mini-batches."""
    return [
        *common_overrides(model, root, train, steps=1),
        "data.train_batch_size=5",
        "rollout.n=1",
        "rollout.top_k=1",
        "algorithm.adv_estimator=reinforce_plus_plus",
        # the untrained model scores 0 everywhere (zero advantages): the entropy bonus
        # gives every layout the same non-zero gradient to agree on
        "actor.entropy_coeff=0.01",
        "actor.ppo_mini_batch_size=3",  # mini-batches of 3 and 2 rows
        "actor.engine.micro_batch.micro_batch_size=2",
        "trainer.resume_mode=disable",
    ]


def assert_same_weights(first: Path, second: Path) -> None:
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=ATOL, rtol=0, msg=name)


def test_one_step_on_2_and_3_workers_equals_one_worker(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    train, _ = task_files(tmp_path)
    base = deterministic_step(tiny_model_dir, tmp_path, train)
    layouts = {
        "1": [],
        "2": ["trainer.n_workers=2"],
        "3": ["trainer.n_workers=3"],
        "2+3 separate": [
            "trainer.n_workers=2",
            "trainer.placement=separate",
            "trainer.rollout_workers=3",
        ],
    }
    metrics = {
        name: one_step([*base, *extra], tmp_path / f"export_{i}")
        for i, (name, extra) in enumerate(layouts.items())
    }
    reference = metrics["1"]
    assert reference["actor/grad_norm"] > 0
    for i, name in enumerate(layouts):
        for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/entropy"):
            assert metrics[name][key] == pytest.approx(reference[key], abs=ATOL), (name, key)
        assert metrics[name]["actor/grad_norm"] == pytest.approx(
            reference["actor/grad_norm"], rel=1e-4
        ), name
        assert_same_weights(tmp_path / "export_0", tmp_path / f"export_{i}")


def test_grpo_and_ppo_with_critic_on_uneven_splits(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    train, _ = task_files(tmp_path)
    base = [
        *common_overrides(tiny_model_dir, tmp_path, train, steps=2),
        "data.train_batch_size=5",
        "rollout.n=3",  # 15 rows a step: 8 + 7 on 2 workers, 5 x 3 on 3
        "actor.ppo_mini_batch_size=7",
        "actor.engine.micro_batch.micro_batch_size=3",
        "trainer.resume_mode=disable",
    ]
    torch.set_num_threads(1)
    grpo = load_config(
        RLConfig,
        overrides=[*base, "algorithm.adv_estimator=grpo", "trainer.n_workers=3"],
    )
    with PPOTrainer(grpo) as trainer:
        history = trainer.fit()
    assert_finite(history, ["actor/pg_loss", "actor/grad_norm", "critic/score/mean"])

    ppo = load_config(
        RLConfig,
        overrides=[
            *base,
            "algorithm.adv_estimator=gae",
            f"critic.engine.model.path={tiny_model_dir}",
            "critic.ppo_mini_batch_size=4",
            "critic.engine.micro_batch.max_tokens=40",
            "trainer.n_workers=2",
            "trainer.placement=separate",
            "trainer.rollout_workers=3",
        ],
    )
    with PPOTrainer(ppo) as trainer:
        history = trainer.fit()
    assert_finite(history, ["actor/pg_loss", "critic/vf_loss", "critic/values/mean"])


def test_dpo_on_3_workers_with_an_uneven_pair_count(
    ray_session: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    train, val = pair_files(tmp_path)
    overrides = [
        *dpo_overrides(tiny_model_dir, tmp_path, train, val),
        "data.train_batch_size=5",  # 10 rows: 4 + 4 + 2 keep each pair on one worker
        "dpo.mini_batch_size=5",
        "trainer.n_workers=3",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
    ]
    torch.set_num_threads(1)
    with DPOTrainer(load_config(DPOConfig, overrides=overrides)) as trainer:
        history = trainer.fit()
    assert_finite(history, ["actor/dpo_loss", "actor/grad_norm"])
    assert "val/dpo/reward_accuracy" in history[-1]


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        (["trainer.nnodes=2", "trainer.n_workers=2"], "alive node"),
        (["trainer.cpus_per_worker=64"], "CPU"),
        (["trainer.use_gpu=true"], "GPU"),
    ],
)
def test_a_layout_the_cluster_cannot_hold_is_refused_before_any_worker_starts(
    layout: list[str],
    expected: str,
    ray_session: Any,
    toy_task_scored: str,
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    from ray.util import placement_group_table

    from hf_controller import ConfigurationError

    train, _ = task_files(tmp_path)
    config = load_config(
        RLConfig,
        overrides=[*common_overrides(tiny_model_dir, tmp_path, train, steps=1), *layout],
    )
    before = {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"}
    with pytest.raises(ConfigurationError, match=expected):
        PPOTrainer(config).start()
    after = {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"}
    assert after == before
