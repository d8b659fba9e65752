"""DAPO dynamic sampling (``algorithm.filter_groups``) and the hybrid memory phases, end to end.

The scoring function here makes half of the prompt groups all-equal on purpose: rows with an
even ``extra_info.index`` all score 0.5, the others score by their (random) text, so their
two samples almost always differ. With ``data.shuffle=false`` every batch of 4 prompts holds
2 of each kind, so a step needs at least 2 prompt batches for 4 varied groups.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer
from hf_algos.trainers.ppo.dynamic_sampling import sequence_metric
from hf_protocol import DataProto, fields

from .toy_task import SORT_DIGITS_SOURCE
from .trainer_helpers import common_overrides, task_files

pytestmark = pytest.mark.timeout(600)


def half_alike_score(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """0.5 for even-indexed prompts (a group that teaches nothing), else a text hash in [0, 1)."""
    index = int((extra_info or {}).get("index", 0))
    if index % 2 == 0:
        return 0.5
    return (sum(map(ord, solution)) % 97) / 97


def all_alike_score(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """Every sample scores 1: no group survives the filter."""
    return 1.0


@pytest.fixture
def scored_by(request: pytest.FixtureRequest) -> Iterator[None]:
    from hf_algos.rewards import SCORING_FUNCTIONS, register_scoring_function

    register_scoring_function(SORT_DIGITS_SOURCE, request.param)
    try:
        yield
    finally:
        SCORING_FUNCTIONS.pop(SORT_DIGITS_SOURCE, None)


def build(overrides: list[str]) -> PPOTrainer:
    torch.set_num_threads(1)
    return PPOTrainer(load_config(RLConfig, overrides=overrides))


def filtered_run(model: Path, root: Path, steps: int, *extra: str) -> list[str]:
    train, _ = task_files(root)
    return [
        *common_overrides(model, root, train, steps=steps),
        "algorithm.adv_estimator=grpo",
        "algorithm.filter_groups.enable=true",
        "data.shuffle=false",
        "trainer.resume_mode=disable",
        f"trainer.checkpoint_dir={root / 'ckpt'}",
        *extra,
    ]


@pytest.mark.parametrize("scored_by", [half_alike_score], indirect=True)
def test_filter_groups_refills_to_target_and_phases_run(
    ray_session: Any, scored_by: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    overrides = filtered_run(
        tiny_model_dir,
        tmp_path,
        2,
        "algorithm.filter_groups.max_num_gen_batches=3",
        "actor.engine.offload=true",  # a no-op on CPU (FSDPEngine.offload), but still called
    )
    with build(overrides) as trainer:
        history = trainer.fit()
        position = trainer.loader.state_dict()
    draws = 0
    for metrics in history:
        gen = metrics["filter_groups/gen_batches"]
        kept = metrics["filter_groups/kept_groups"]
        dropped = metrics["filter_groups/dropped_groups"]
        assert 2 <= gen <= 3  # one batch has only 2 varied groups
        assert dropped >= 2 * gen  # the even-indexed groups, every batch
        assert kept == 4 or (gen == 3 and metrics["filter_groups/short_of_target"] == 1.0)
        assert kept + dropped <= 4 * gen
        for phase in ("offload", "wake_up", "sleep", "onload", "update_actor", "sync_weights"):
            assert f"timing_s/{phase}" in metrics, phase
        assert math.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0
        # the batch trained on: kept groups x rollout.n rows
        assert metrics["response_length/mean"] > 0
        draws += int(gen)
    # every prompt batch drawn advanced the loader: 4 batches an epoch
    assert divmod(draws, 4) == (position["epoch"], position["batch_in_epoch"])


@pytest.mark.parametrize("scored_by", [all_alike_score], indirect=True)
def test_filter_groups_skips_the_update_when_no_group_survives(
    scored_by: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    overrides = filtered_run(
        tiny_model_dir,
        tmp_path,
        1,
        "algorithm.filter_groups.max_num_gen_batches=2",
        "trainer.backend=local",
    )
    with build(overrides) as trainer:
        (metrics,) = trainer.fit()
    assert metrics["filter_groups/skipped_update"] == 1.0
    assert metrics["filter_groups/kept_groups"] == 0.0
    assert metrics["filter_groups/dropped_groups"] == 8.0  # 2 batches x 4 prompts
    assert metrics["filter_groups/gen_batches"] == 2.0
    assert "timing_s/sleep" in metrics and "actor/pg_loss" not in metrics


def test_sequence_metric_reads_score_or_reward_extra_info() -> None:
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]])
    batch = DataProto.from_dict(
        tensors={fields.TOKEN_LEVEL_SCORES: scores},
        non_tensors={fields.REWARD_EXTRA_INFO: [{"acc": True}, {"acc": False}]},
    )
    assert sequence_metric(batch, "score").tolist() == [1.0, 0.5]
    assert sequence_metric(batch, "acc").tolist() == [1.0, 0.0]
    with pytest.raises(KeyError, match=r"metric='pred'.*\['acc'\]"):
        sequence_metric(batch, "pred")
    failed = {"score": 0.5, "status": "error", "error": "ValueError: bad"}
    mixed = DataProto.from_dict(
        tensors={fields.TOKEN_LEVEL_SCORES: scores},
        non_tensors={fields.REWARD_EXTRA_INFO: [{"acc": True, "status": "ok"}, failed]},
    )
    assert sequence_metric(mixed, "acc").tolist() == [1.0, 0.5]  # the failed row: its score
    unset = DataProto.from_dict(
        tensors={fields.TOKEN_LEVEL_SCORES: scores},
        non_tensors={fields.REWARD_EXTRA_INFO: [{"acc": 1.0}, {"acc": None, "status": "ok"}]},
    )
    with pytest.raises(ValueError, match=r"metric='acc': row 1 was scored but its 'acc' is None"):
        sequence_metric(unset, "acc")
