"""The trainers on Megatron layouts beyond one kind of model parallelism: TP x PP on 4
workers (with exact resume), data parallelism times TP or PP on 4 workers against 1-rank
FSDP, expert parallelism on a tiny Qwen3-MoE, and multi-turn GRPO and online DPO on TP2.

Each run is 1-2 steps of a tiny model on gloo CPU ranks: what is proven is that the layout
runs inside the trainer (and, where cheap, computes what one rank computes), not what it
learns."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_algos.config import DPOConfig, load_config
from hf_algos.trainers import DPOTrainer

from . import test_trainer_parity as parity
from .test_trainer_megatron import GRPO_METRICS, grpo, megatron, run_rl
from .test_trainer_multi_turn import MULTI_TURN_METRICS
from .toy_task import SORT_DIGITS_SOURCE
from .trainer_helpers import assert_finite, common_overrides, comparable, task_files

pytestmark = [pytest.mark.second_lane, pytest.mark.timeout(900)]

EP = "actor.engine.megatron.expert_model_parallel_size"


@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Qwen3-MoE (4 experts, top-2) with the character tokenizer."""
    from hf_algos.data import build_char_tokenizer
    from hf_engines.testing import build_tiny_model

    directory = build_tiny_model(tmp_path_factory.mktemp("moe") / "qwen3_moe", "qwen3_moe")
    build_char_tokenizer(directory, chat_template=None)
    return directory


def saved_layout(step_dir: Path) -> dict[str, Any]:
    """The Megatron layout the actor's checkpoint in ``step_dir`` was saved from."""
    meta = json.loads((step_dir / "actor" / "meta.json").read_text())
    keys = ("world_size", "tensor_model_parallel_size", "pipeline_model_parallel_size")
    return {key: meta[key] for key in (*keys, "expert_model_parallel_size") if key in meta}


def score_by_characters(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """A score in [0, 1] that sets almost any two texts apart (their code points' sum mod 97):
    the untrained model never sorts digits, so the toy task's score ties all its samples,
    GRPO's advantages are all 0 and online DPO finds no pair to train on."""
    return (sum(map(ord, solution)) % 97) / 96


@pytest.fixture
def toy_task_spread_scores() -> Iterator[str]:
    """The toy task's rows scored by :func:`score_by_characters`, for one test."""
    from hf_algos.rewards import SCORING_FUNCTIONS, register_scoring_function

    register_scoring_function(SORT_DIGITS_SOURCE, score_by_characters)
    try:
        yield SORT_DIGITS_SOURCE
    finally:
        SCORING_FUNCTIONS.pop(SORT_DIGITS_SOURCE, None)


def test_grpo_tensor_times_pipeline_parallel_resumes_exactly(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """TP2 x PP2 on 4 workers: 2 steps with a checkpoint at 1; the run resumed from it
    repeats step 2 exactly."""
    base = [*megatron("actor", tp=2, pp=2), "trainer.n_workers=4"]
    full = run_rl(
        [
            *grpo(tiny_model_dir, tmp_path, 2, *base),
            "trainer.save_freq=1",
            f"trainer.checkpoint_dir={tmp_path / 'a'}",
        ]
    )
    resumed = run_rl(
        [
            *grpo(tiny_model_dir, tmp_path, 2, *base),
            "trainer.resume_mode=path",
            f"trainer.resume_from={tmp_path / 'a' / 'global_step_1'}",
            f"trainer.checkpoint_dir={tmp_path / 'b'}",
        ]
    )
    assert len(full) == 2
    assert_finite(full, [*GRPO_METRICS, "actor/kl_loss"])
    assert full[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # reference = actor
    assert len(resumed) == 1 and comparable(resumed[0]) == comparable(full[1])
    assert saved_layout(tmp_path / "a" / "global_step_1") == {
        "world_size": 4,
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2,
    }


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["dp2xtp2", "dp2xpp2"])
def test_grpo_data_times_model_parallel_matches_one_rank_fsdp(
    ray_session: Any,
    toy_task_spread_scores: str,
    tiny_model_dir: Path,
    tmp_path: Path,
    tp: int,
    pp: int,
) -> None:
    """2 data-parallel replicas of a TP2 or PP2 model (4 workers): step 1's loss, entropy,
    grad norm and reward equal the 1-rank FSDP run's within the parity test's bounds. The
    spread scores give non-zero advantages, so the policy-gradient loss is compared too (the
    toy task's own score is 0 for every sample of the untrained model)."""
    histories = {
        name: parity.run(
            [
                *parity.grpo_overrides(tiny_model_dir, tmp_path / name),
                "trainer.total_training_steps=1",
                *extra,
            ]
        )
        for name, extra in {
            "fsdp-1": parity.LAYOUTS["fsdp-1"],
            "megatron": ["trainer.n_workers=4", *megatron("actor", tp=tp, pp=pp)],
        }.items()
    }
    reference, got = histories["fsdp-1"], histories["megatron"]
    assert len(reference) == len(got) == 1
    assert reference[0]["actor/grad_norm"] > 0 and reference[0]["actor/pg_loss"] != 0
    print(parity.relative_gaps(got, reference))
    for key in parity.COMPARED:
        want = reference[0][key]
        assert got[0][key] == pytest.approx(want, rel=parity.RTOL, abs=parity.ATOL), key


def test_grpo_expert_parallel_on_a_tiny_moe(
    ray_session: Any, toy_task_scored: str, moe_model_dir: Path, tmp_path: Path
) -> None:
    """EP2 on 2 workers (so 2 data-parallel replicas, each holding half the experts)."""
    history = run_rl(grpo(moe_model_dir, tmp_path, 2, "actor.engine.backend=megatron", f"{EP}=2"))
    assert len(history) == 2
    assert_finite(history, [*GRPO_METRICS, "actor/kl_loss"])
    assert history[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # reference = actor
    layout = saved_layout(tmp_path / "ckpt" / "global_step_2")
    assert (layout["world_size"], layout["expert_model_parallel_size"]) == (2, 2)


def test_multi_turn_grpo_tensor_parallel(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """GRPO with the calculator tool (the multi-turn trainer test's overrides) on TP2."""
    overrides = [
        *grpo(tiny_model_dir, tmp_path, 1, *megatron("actor", tp=2)),
        "rollout.max_new_tokens=16",
        "rollout.multi_turn.enable=true",
        "rollout.multi_turn.max_turns=2",
        "rollout.multi_turn.tools=[calc]",
        "rollout.multi_turn.max_tokens_per_turn=8",
        "rollout.multi_turn.reward=both",
    ]
    history = run_rl(overrides)
    assert len(history) == 1
    assert_finite(history, [*MULTI_TURN_METRICS, *GRPO_METRICS])
    assert 1.0 <= history[0]["multi_turn/num_turns/mean"] <= 2.0


def test_online_dpo_tensor_parallel(
    ray_session: Any, toy_task_spread_scores: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Online DPO (pairs from the rollout's scored samples) with the actor on TP2."""
    train, _ = task_files(tmp_path)
    overrides = [
        # the online DPO trainer test's overrides (no actor.ppo_mini_batch_size: DPO's own)
        *common_overrides(tiny_model_dir, tmp_path, train, steps=1)[:4],
        "dpo.online=true",
        "rollout.n=4",
        "dpo.mini_batch_size=2",
        "actor.engine.micro_batch.micro_batch_size=2",
        "rollout.max_new_tokens=6",
        "trainer.total_training_steps=1",
        "trainer.loggers=[jsonl]",
        "trainer.progress_bar=false",
        f"trainer.log_dir={tmp_path / 'logs'}",
        "reward.num_workers=1",
        "trainer.n_workers=2",
        f"trainer.checkpoint_dir={tmp_path / 'ckpt'}",
        *megatron("actor", tp=2),
    ]
    torch.set_num_threads(1)
    with DPOTrainer(load_config(DPOConfig, overrides=overrides)) as trainer:
        history = trainer.fit()
    assert len(history) == 1
    assert_finite(history, ["dpo/pairs", "online/critic/score/mean", "timing_s/gen"])
    # spread scores: every prompt's samples score apart, so the update runs on Megatron
    assert history[0]["dpo/pairs"] > 0
    assert_finite(history, ["actor/dpo_loss", "actor/grad_norm"])
