"""PPO (with a critic) and GRPO end to end on Ray: finite losses, metrics, exact resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from hf_algos.config import RLConfig, load_config
from hf_algos.tracking import metrics_path
from hf_algos.trainers import PPOTrainer
from hf_protocol import DataProto, fields
from hf_rollout import RolloutConfig, SamplingConfig, build_rollout
from hf_rollout.base import pad_responses_to
from hf_rollout.testing import make_prompts

from .trainer_helpers import assert_finite, common_overrides, comparable, task_files

pytestmark = pytest.mark.timeout(600)

CORE_METRICS = (
    "critic/score/mean",
    "critic/rewards/mean",
    "critic/advantages/mean",
    "response_length/mean",
    "prompt_length/mean",
    "timing_s/gen",
    "timing_s/update_actor",
    "perf/throughput",
    "actor/pg_loss",
    "actor/grad_norm",
)


def run(overrides: list[str]) -> list[dict[str, float]]:
    torch.set_num_threads(1)
    config = load_config(RLConfig, overrides=overrides)
    with PPOTrainer(config) as trainer:
        return trainer.fit()


def run_and_resume(base: list[str], root: Path) -> tuple[list[dict[str, float]], Any]:
    """3 steps with a checkpoint at 2; then a new run resumed from step 2."""
    full = run(
        [
            *base,
            "trainer.save_freq=2",
            f"trainer.checkpoint_dir={root / 'a'}",
            "trainer.resume_mode=disable",
        ]
    )
    resumed = run(
        [
            *base,
            "trainer.resume_mode=path",
            f"trainer.resume_from={root / 'a' / 'global_step_2'}",
            f"trainer.checkpoint_dir={root / 'b'}",
        ]
    )
    return full, resumed


def test_ppo_with_critic_resumes_exactly(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    train, _ = task_files(tmp_path)
    base = [
        *common_overrides(tiny_model_dir, tmp_path, train, steps=3),
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.type=adaptive",
        f"critic.engine.model.path={tiny_model_dir}",
        "critic.ppo_mini_batch_size=4",
        "critic.engine.micro_batch.micro_batch_size=4",
        "critic.engine.optim.lr=1e-3",
    ]
    full, resumed = run_and_resume(base, tmp_path)
    assert len(full) == 3 and len(resumed) == 1
    assert_finite(
        full,
        [
            *CORE_METRICS,
            "critic/vf_loss",
            "critic/values/mean",
            "timing_s/update_critic",
            "actor/reward_kl_penalty_coeff",
        ],
    )
    assert full[2]["critic/vf_loss"] > 0
    assert comparable(resumed[0]) == comparable(full[2])
    assert {p.name for p in (tmp_path / "a" / "global_step_2").iterdir()} >= {
        "actor",
        "critic",
        "trainer_state.pt",
    }
    # the resumed run continues the run id of its checkpoint: one run directory, appended to
    (run_directory,) = (tmp_path / "logs" / "hybridflow" / "run").iterdir()
    lines = metrics_path(tmp_path / "logs", "hybridflow", "run").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 3]
    assert yaml.safe_load((run_directory / "config.yaml").read_text())["critic"]["engine"]
    assert (tmp_path / "a" / "config.yaml").is_file()  # next to the checkpoints too


def test_grpo_separate_placement_resumes_and_validates(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    train, val = task_files(tmp_path)
    base = [
        *common_overrides(tiny_model_dir, tmp_path, train, steps=3),
        "algorithm.adv_estimator=grpo",
        "actor.use_kl_loss=true",
        "trainer.placement=separate",
        f"data.val_files=[{val}]",
        "trainer.test_freq=2",
        "trainer.log_val_generations=3",
        "trainer.trace_file=trace.json",
        "actor_rollout_ref.rollout.val_kwargs.n=3",  # verl's name of trainer.val_samples
    ]
    full, resumed = run_and_resume(base, tmp_path)
    run_directory = metrics_path(tmp_path / "logs", "hybridflow", "run").parent
    generations = [json.loads(x) for x in (run_directory / "generations.jsonl").open()]
    # validations at steps 2 and 3, then 3 again in the resumed run: 3 samples each
    assert [g["step"] for g in generations] == [2, 2, 2, 3, 3, 3, 3, 3, 3]
    assert all(g["prompt"] and isinstance(g["score"], float) for g in generations)
    assert {g["data_source"] for g in generations} == {toy_task_scored}
    assert all(g["ground_truth"] for g in generations)
    trace = json.loads((run_directory / "trace.json").read_text())["traceEvents"]
    calls = {e["name"] for e in trace if e["ph"] == "X"}  # fused roles: "<role>_<method>"
    for method in ("generate_sequences", "update_actor", "compute_ref_log_prob"):
        assert any(name.endswith(method) for name in calls), (method, calls)
    assert len({e["pid"] for e in trace if e["ph"] == "X"}) >= 2  # the actor's and rollout's
    assert all(e["dur"] >= 0 and e["ts"] > 0 for e in trace if e["ph"] == "X")
    assert_finite(full, [*CORE_METRICS, "actor/kl_loss", "timing_s/ref"])
    assert "val/score/mean" in full[1] and "val/accuracy" in full[2]
    assert f"val/{toy_task_scored}/score/mean" in full[2]
    sampled, passed = full[2]["val/sampled/accuracy"], full[2]["val/sampled/pass@3"]
    assert 0.0 <= sampled <= passed <= 1.0
    assert comparable(resumed[0]) == comparable(full[2])
    # the policy changed: the KL to the reference grew from exactly 0 at the first step
    assert full[0]["actor/kl_loss"] == 0.0 and full[2]["actor/kl_loss"] > 0.0


def test_separate_placement_rollout_holds_the_actors_weights(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """2 actor ranks stream to 2 rollout ranks over the weight channel (small buckets):
    after a step the rollout generates exactly as the actor's exported weights do."""
    train, _ = task_files(tmp_path)
    config = load_config(
        RLConfig,
        overrides=[
            *common_overrides(tiny_model_dir, tmp_path, train, steps=1),
            "algorithm.adv_estimator=grpo",
            "trainer.placement=separate",
            "trainer.n_workers=2",
            "trainer.rollout_workers=2",
            "trainer.weight_bucket_mb=1",
            "actor.engine.micro_batch.micro_batch_size=2",
            "actor.engine.optim.lr=0.05",  # one step must move the log-probs measurably
            "trainer.resume_mode=disable",
            f"trainer.checkpoint_dir={tmp_path / 'ckpt'}",
        ],
    )
    torch.set_num_threads(1)
    sampling = SamplingConfig(greedy=True, max_new_tokens=6)
    prompts = make_prompts([[5, 6, 7], [8, 9, 10, 11]], pad_token_id=0)
    prompts.meta_info[fields.SAMPLING] = sampling
    with PPOTrainer(config) as trainer:
        history = trainer.fit()
        trainer.roles.actor.export_hf(str(tmp_path / "actor"))
        remote = trainer.roles.rollout.generate_sequences(prompts)
    assert_finite(history, CORE_METRICS)

    def generate_locally(model: Path) -> DataProto:
        engine = build_rollout(RolloutConfig(model_path=str(model), pad_token_id=0))
        return pad_responses_to(engine.generate(prompts, sampling), sampling.max_new_tokens, 0)

    assert remote.batch is not None
    trained, initial = generate_locally(tmp_path / "actor"), generate_locally(tiny_model_dir)
    assert trained.batch is not None and initial.batch is not None
    log_probs = remote.batch[fields.ROLLOUT_LOG_PROBS]
    assert torch.equal(remote.batch[fields.RESPONSES], trained.batch[fields.RESPONSES])
    torch.testing.assert_close(
        log_probs, trained.batch[fields.ROLLOUT_LOG_PROBS], rtol=0, atol=1e-6
    )
    # not vacuous: the step moved the weights away from the ones the rollout started with
    moved = (log_probs - initial.batch[fields.ROLLOUT_LOG_PROBS]).abs().max()
    assert moved > 1e-4, moved  # 100x the tolerance above


@pytest.mark.parametrize("estimator", ["remax", "rloo", "reinforce_plus_plus"])
def test_critic_free_estimators_in_process(
    estimator: str, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The same driver with other estimators, workers in the driver (``backend=local``)."""
    train, _ = task_files(tmp_path)
    history = run(
        [
            *common_overrides(tiny_model_dir, tmp_path, train, steps=1),
            f"algorithm.adv_estimator={estimator}",
            "actor.use_rollout_log_probs=true",
            "trainer.backend=local",
            "trainer.resume_mode=disable",
            f"trainer.checkpoint_dir={tmp_path / 'ckpt'}",
        ]
    )
    names = list(CORE_METRICS)
    if estimator == "remax":
        names.append("critic/reward_baseline/mean")
    assert_finite(history, names)


def test_a_run_measured_in_epochs_takes_its_length_from_the_data(
    toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """verl's default run length: ``trainer.total_epochs`` with no step count. The workers'
    LR schedules need the run's length before they start, so the data loads first
    (constructing the trainer then raised AttributeError: no ``loader`` yet)."""
    train, _ = task_files(tmp_path)  # 16 rows: 4 batches of 4 prompts per epoch
    overrides = [
        *common_overrides(tiny_model_dir, tmp_path, train, steps=1),
        "trainer.total_training_steps=null",
        "trainer.total_epochs=2",
        "trainer.backend=local",
        "actor.engine.optim.schedule=cosine",
    ]
    torch.set_num_threads(1)
    with PPOTrainer(load_config(RLConfig, overrides=overrides)) as trainer:
        assert trainer.total_steps == 8
        history = trainer.fit()
    assert [m["training/global_step"] for m in history] == list(range(1, 9))
    assert_finite(history, ("actor/pg_loss", "actor/lr"))
    assert history[-1]["actor/lr"] < history[0]["actor/lr"]  # the cosine ends at step 8
