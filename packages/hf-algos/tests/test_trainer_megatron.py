"""The trainers on ``backend: megatron``: GRPO, PPO (with a Megatron critic), DPO and SFT on
2 gloo CPU ranks with tensor or pipeline parallelism, in the hybrid and separate placements,
with checkpoint, resume and export. Each run is 1-2 steps of a tiny model: what is proven is
that every role of every trainer runs on the Megatron engine, not what it learns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hf_algos.config import DPOConfig, RLConfig, SFTConfig, load_config
from hf_algos.trainers import DPOTrainer, PPOTrainer, SFTTrainer
from hf_controller import ConfigurationError

from .test_trainer_dpo import dpo_overrides, pair_files
from .trainer_helpers import assert_finite, common_overrides, comparable, task_files

pytestmark = [pytest.mark.second_lane, pytest.mark.timeout(600)]

GRPO_METRICS = ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "timing_s/gen")


def megatron(role: str, tp: int = 1, pp: int = 1) -> list[str]:
    """``role``'s engine on Megatron with ``tp`` x ``pp`` model parallelism."""
    return [
        f"{role}.engine.backend=megatron",
        f"{role}.engine.megatron.tensor_model_parallel_size={tp}",
        f"{role}.engine.megatron.pipeline_model_parallel_size={pp}",
    ]


def grpo(model: Path, root: Path, steps: int, *extra: str) -> list[str]:
    """GRPO with the KL loss (so the reference runs too) on 2 workers, ``steps`` steps."""
    train, _ = task_files(root)
    return [
        *common_overrides(model, root, train, steps),
        "algorithm.adv_estimator=grpo",
        "actor.use_kl_loss=true",
        "trainer.n_workers=2",
        "actor.engine.micro_batch.micro_batch_size=2",
        f"trainer.checkpoint_dir={root / 'ckpt'}",
        *extra,
    ]


def run_rl(overrides: list[str]) -> list[dict[str, float]]:
    torch.set_num_threads(1)
    with PPOTrainer(load_config(RLConfig, overrides=overrides)) as trainer:
        return trainer.fit()


def test_grpo_hybrid_tensor_parallel(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    history = run_rl(grpo(tiny_model_dir, tmp_path, 2, *megatron("actor", tp=2)))
    assert len(history) == 2
    assert_finite(history, [*GRPO_METRICS, "actor/kl_loss"])
    assert history[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # reference = actor


def test_grpo_hybrid_pipeline_parallel(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    history = run_rl(grpo(tiny_model_dir, tmp_path, 1, *megatron("actor", pp=2)))
    assert_finite(history, [*GRPO_METRICS, "actor/kl_loss"])


@pytest.mark.parametrize("mode", ["off", "one_step_off", "fully_async"])
def test_grpo_separate_placement_pipeline_parallel(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path, mode: str
) -> None:
    """The actor on 2 Megatron ranks (PP2), the rollout on its own worker, fed by weight
    pushes gathered from the pipeline stages; with the async modes too."""
    extra = [
        "trainer.placement=separate",
        "trainer.rollout_workers=1",
        f"trainer.async_mode={mode}",
        "algorithm.rollout_correction.mode=tis",
    ]
    steps = 1 if mode == "off" else 2  # an async step 2 trains on a lagging generation
    history = run_rl(grpo(tiny_model_dir, tmp_path, steps, *megatron("actor", pp=2), *extra))
    assert len(history) == steps
    assert_finite(history, GRPO_METRICS)


def test_ppo_megatron_critic_resumes_exactly_and_exports(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Actor and critic on Megatron TP2: 2 steps with a checkpoint at 1, a run resumed from
    it repeats step 2, and both roles' checkpoints export to loadable Hugging Face models."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from hf_algos.export import export_checkpoint

    train, _ = task_files(tmp_path)
    base = [
        *common_overrides(tiny_model_dir, tmp_path, train, steps=2),
        "algorithm.adv_estimator=gae",
        "trainer.n_workers=2",
        "actor.engine.micro_batch.micro_batch_size=2",
        f"critic.engine.model.path={tiny_model_dir}",
        "critic.ppo_mini_batch_size=4",
        "critic.engine.micro_batch.micro_batch_size=2",
        "critic.engine.optim.lr=1e-3",
        *megatron("actor", tp=2),
        *megatron("critic", tp=2),
    ]
    full = run_rl([*base, "trainer.save_freq=1", f"trainer.checkpoint_dir={tmp_path / 'a'}"])
    resumed = run_rl(
        [
            *base,
            "trainer.resume_mode=path",
            f"trainer.resume_from={tmp_path / 'a' / 'global_step_1'}",
            f"trainer.checkpoint_dir={tmp_path / 'b'}",
        ]
    )
    assert_finite(full, [*GRPO_METRICS, "critic/vf_loss", "critic/values/mean"])
    assert len(resumed) == 1 and comparable(resumed[0]) == comparable(full[1])
    step = tmp_path / "a" / "global_step_2"
    policy = AutoModelForCausalLM.from_pretrained(export_checkpoint(step, tmp_path / "policy"))
    assert policy.config.num_hidden_layers == 2
    values = export_checkpoint(step, tmp_path / "values", role="critic")
    assert AutoModelForTokenClassification.from_pretrained(values).config.num_labels == 1


def test_dpo_tensor_parallel(ray_session: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    train, val = pair_files(tmp_path)
    overrides = [
        *dpo_overrides(tiny_model_dir, tmp_path, train, val),
        "trainer.total_training_steps=1",
        "trainer.test_freq=1",
        "trainer.n_workers=2",
        f"trainer.checkpoint_dir={tmp_path / 'ckpt'}",
        *megatron("actor", tp=2),
    ]
    torch.set_num_threads(1)
    with DPOTrainer(load_config(DPOConfig, overrides=overrides)) as trainer:
        history = trainer.fit()
    assert_finite(history, ["actor/dpo_loss", "actor/reward_margin", "actor/grad_norm"])
    # the first step starts at the reference (on the same Megatron layout): loss log(2)
    assert history[0]["actor/dpo_loss"] == pytest.approx(0.6931, abs=1e-3)
    assert "val/dpo/reward_accuracy" in history[0]


@pytest.mark.parametrize(("tp", "pp"), [(1, 2), (1, 1)], ids=["pp2", "dp2"])
def test_sft_pipeline_or_data_parallel(
    ray_session: Any, tiny_model_dir: Path, tmp_path: Path, tp: int, pp: int
) -> None:
    """PP2, and plain data parallelism over 2 Megatron replicas (rows split per replica)."""
    train, _ = pair_files(tmp_path)
    config = load_config(
        SFTConfig,
        overrides=[
            f"actor.engine.model.path={tiny_model_dir}",
            f"data.train_files=[{train}]",
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4",
            "actor.engine.micro_batch.micro_batch_size=2",
            "actor.engine.optim.lr=1e-2",
            "trainer.total_training_steps=2",
            "trainer.n_workers=2",
            "trainer.loggers=[]",
            "trainer.progress_bar=false",
            f"trainer.checkpoint_dir={tmp_path / 'sft'}",
            *megatron("actor", tp=tp, pp=pp),
        ],
    )
    torch.set_num_threads(1)
    with SFTTrainer(config) as trainer:
        history = trainer.fit()
    assert_finite(history, ["actor/sft_nll", "actor/grad_norm"])
    assert history[1]["actor/sft_nll"] < history[0]["actor/sft_nll"]


def test_lora_on_megatron_is_refused_naming_fsdp(tiny_model_dir: Path, tmp_path: Path) -> None:
    overrides = [*grpo(tiny_model_dir, tmp_path, 1, *megatron("actor", tp=2)), "actor.lora.rank=4"]
    with pytest.raises(ConfigurationError, match=r"lora.rank=4 needs the FSDP2 engine.*"
                       r"set backend='fsdp'"):  # fmt: skip
        load_config(RLConfig, overrides=overrides)
