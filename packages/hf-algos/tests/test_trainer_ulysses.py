"""GRPO with Ulysses sequence parallelism (sp=2 on 2 workers) against 1 worker, per step.

Both runs use the hybrid placement, so the 2-worker run samples on two rollout workers: each
prompt row draws from its own stream (seeded by the step and the row's index in the
request), so they draw what one worker draws. With the same samples, sequence parallelism
must leave every step's loss, gradient norm and reward as on one worker (fp32; the sums
run in other orders, hence the relative tolerance).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer
from hf_controller import ConfigurationError

from .toy_task import SORT_DIGITS_SOURCE
from .trainer_helpers import common_overrides, task_files

pytestmark = [pytest.mark.timeout(600), pytest.mark.second_lane]

STEPS = 10
RELATIVE = 1e-4
ABSOLUTE = 1e-6
"""For values near 0 (GRPO's advantages sum to 0 in a group, so the policy loss can be
close to 0): fp32 sums in another order differ by ~1e-7 there."""
COMPARED = (
    "actor/loss",
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/entropy",
    "critic/score/mean",
)


def score_by_text(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """A reward in [0, 1) that differs between most responses (the character codes'
    sum modulo 7): the untrained model's samples get non-zero GRPO advantages, so the
    policy loss and the reward are compared too, not only the entropy bonus."""
    return sum(map(ord, solution)) % 7 / 7


@pytest.fixture
def varied_reward() -> Iterator[None]:
    """:func:`score_by_text` scores the toy task for one test."""
    from hf_algos.rewards import SCORING_FUNCTIONS, register_scoring_function

    register_scoring_function(SORT_DIGITS_SOURCE, score_by_text)
    try:
        yield
    finally:
        SCORING_FUNCTIONS.pop(SORT_DIGITS_SOURCE, None)


def grpo_overrides(model: Path, root: Path, train: Path) -> list[str]:
    """GRPO on the toy task for :data:`STEPS` steps (hybrid placement), an entropy bonus
    (its gradient is compared as well)."""
    return [
        *common_overrides(model, root, train, steps=STEPS),
        "algorithm.adv_estimator=grpo",
        "actor.entropy_coeff=0.01",
        "actor.engine.micro_batch.micro_batch_size=2",
        "trainer.resume_mode=disable",
    ]


def test_sp_size_must_divide_the_workers(tiny_model_dir: Path, tmp_path: Path) -> None:
    train, _ = task_files(tmp_path)
    overrides = [
        *grpo_overrides(tiny_model_dir, tmp_path, train),
        "trainer.n_workers=3",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    ]
    with pytest.raises(ConfigurationError, match="does not divide the 3 workers"):
        load_config(RLConfig, overrides=overrides)


def test_verl_keys_set_the_actor_and_critic_sizes(tiny_model_dir: Path, tmp_path: Path) -> None:
    train, _ = task_files(tmp_path)
    config = load_config(
        RLConfig,
        overrides=[
            *grpo_overrides(tiny_model_dir, tmp_path, train),
            "trainer.n_workers=2",
            "algorithm.adv_estimator=gae",
            f"critic.engine.model.path={tiny_model_dir}",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "critic.ulysses_sequence_parallel_size=2",
        ],
    )
    assert config.actor.engine.fsdp.ulysses_sequence_parallel_size == 2
    assert config.critic is not None
    assert config.critic.engine.fsdp.ulysses_sequence_parallel_size == 2


def fit(overrides: list[str]) -> list[dict[str, float]]:
    """Every step's metrics of a GRPO run."""
    torch.set_num_threads(1)
    with PPOTrainer(load_config(RLConfig, overrides=overrides)) as trainer:
        return trainer.fit()


def test_grpo_sp2_on_2_workers_matches_1_worker_per_step(
    ray_session: Any, varied_reward: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    train, _ = task_files(tmp_path)
    base = grpo_overrides(tiny_model_dir, tmp_path, train)
    one = fit([*base, f"trainer.log_dir={tmp_path / 'one'}"])
    sp = fit(
        [
            *base,
            f"trainer.log_dir={tmp_path / 'sp'}",
            "trainer.n_workers=2",
            "actor.engine.fsdp.ulysses_sequence_parallel_size=2",
        ]
    )
    assert len(one) == len(sp) == STEPS
    assert one[0]["actor/grad_norm"] > 0
    assert any(abs(step["actor/pg_loss"]) > 1e-6 for step in one)
    for step, (want, got) in enumerate(zip(one, sp, strict=True), start=1):
        for key in COMPARED:
            assert got[key] == pytest.approx(want[key], rel=RELATIVE, abs=ABSOLUTE), (step, key)
    pairs = list(zip(one, sp, strict=True))
    worst = {
        key: max(abs(b[key] - a[key]) / max(abs(a[key]), 1e-12) for a, b in pairs)
        for key in COMPARED
    }
    gaps = {key: max(abs(b[key] - a[key]) for a, b in pairs) for key in COMPARED}
    print(f"largest relative / absolute difference over {STEPS} steps: {worst} / {gaps}")
