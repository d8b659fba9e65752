"""Online DPO as a driver script: the worked example of writing a new algorithm.

What it really is, one step:

1. **sample**: ``samples_per_prompt`` responses to each of ``prompts_per_step`` prompts;
2. **score**: each response by the rule-based reward of its row's ``data_source``;
3. **pair**: per prompt, the best response (chosen) against the worst (rejected);
   prompts whose responses all scored the same give no pair;
4. **reference log-prob**: of every paired response, under the frozen initial model;
5. **DPO update**: one optimizer step on ``-log sigmoid(beta * margin)`` of the pairs;
6. the new weights go to the rollout engine (in the same process).

Before the first step, and every ``eval_every`` steps, the held-out prompts are sampled
and scored (``val/score/mean``). With no ``model_path`` the recipe makes a tiny random
Qwen2 and, by default, warms it up with 90 supervised steps on the task (``warmup.py``):
from random weights online DPO has nothing learnable to prefer.

Actor, reference and rollout are three roles fused into one worker group (one process per
GPU or CPU slot); the loop below calls them like local objects. ``DPOTrainer`` (with
``dpo.online=true``) runs the same steps with checkpoints, resume and validation; this
script spells them out. Run from the repository root (about a minute on 2 CPU cores)::

    python -m recipes.online_dpo.main
    python -m recipes.online_dpo.main steps=100 beta=0.2
    python -m recipes.online_dpo.curve --seeds 0 1 2   # the held-out curve of 3 seeds
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from hf_algos.config import RewardSection, config_to_dict, load_config
from hf_algos.data import (
    RLDataset,
    RLDatasetConfig,
    StatefulDataLoader,
    build_char_tokenizer,
    make_preference_batch,
    write_rows,
)
from hf_algos.examples.reverse_letters import make_reverse_letters_rows, register_reward
from hf_algos.losses import dpo_loss_fn
from hf_algos.rewards import RewardManager
from hf_algos.tracking import Tracking, merge_worker_metrics
from hf_controller import (
    ClassWithInitArgs,
    RayClassWithInitArgs,
    RayResourcePool,
    WorkerGroup,
    create_colocated_worker_cls_fused,
    make_worker_group,
)
from hf_engines import EngineConfig
from hf_engines.config import MicroBatchConfig, ModelConfig, OptimConfig
from hf_engines.testing import build_tiny_model
from hf_engines.workers import ActorConfig, ActorWorker, ReferenceWorker
from hf_protocol import DataProto, fields
from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.workers import RolloutWorker
from recipes.cli import parse_recipe_args
from recipes.online_dpo.warmup import sft_warmup

CONFIG_PATH = Path(__file__).with_name("config.yaml")

Metrics = dict[str, float]


@dataclass(frozen=True)
class OnlineDPOConfig:
    """Everything the recipe reads (``config.yaml``); unknown keys are an error."""

    workdir: str = "outputs/online_dpo"
    """Logs, the final model, and the generated model and data when none are given."""
    model_path: str | None = None
    """Local Hugging Face model directory with its tokenizer; ``None`` makes a tiny one."""
    tokenizer_path: str | None = None
    """Local tokenizer directory; ``None`` reads the tokenizer from ``model_path``."""
    train_files: tuple[str, ...] = ()
    """Prompt rows (``hf_algos.data`` format); empty generates reverse-letters prompts."""
    val_files: tuple[str, ...] = ()
    """Held-out prompt rows; empty with generated training rows: generated ones (other seed)."""
    word_length: int = 6
    """Letters per generated prompt (the quickstart's task uses 6)."""
    warmup_steps: int = 0
    """Supervised steps (32 rows each) on the generated task before online DPO, applied to
    the generated tiny model only (see ``warmup.py``); 0 starts from random weights."""
    warmup_lr: float = 3e-3
    """AdamW learning rate of the warm-up."""
    steps: int = 30
    """Training steps (one DPO optimizer step each)."""
    prompts_per_step: int = 16
    """Prompts sampled per step."""
    samples_per_prompt: int = 4
    """Responses per prompt; the best and the worst become a pair."""
    eval_every: int = 5
    """Score the held-out prompts before training, every this many steps and at the end;
    0 never."""
    eval_prompts: int = 64
    """Held-out prompts scored (the first of ``val_files``, or generated)."""
    eval_samples: int = 4
    """Responses sampled per held-out prompt (same seed every time, so only the policy
    changes between evaluations)."""
    max_prompt_length: int = 16
    """Longer prompts are dropped from the data."""
    max_new_tokens: int = 7
    """Longest response."""
    temperature: float = 1.0
    """Sampling temperature (log-probs are taken at the same temperature)."""
    beta: float = 0.1
    """DPO inverse temperature: how far the policy may move from the reference."""
    loss_type: str = "sigmoid"
    """DPO loss variant of ``hf_algos.losses.DPO_LOSSES``."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, weight_decay=0.0))
    """The actor's AdamW settings."""
    micro_batch_size: int = 8
    """Rows per forward/backward; even, so a pair's two rows stay together."""
    workers: int = 1
    """Processes of the fused actor + reference + rollout group (one per GPU)."""
    use_gpu: bool = False
    """One GPU per worker."""
    rollout_backend: str = "native"
    """Generation engine: native, vllm or sglang."""
    dtype: str = "float32"
    """Dtype of the model's parameters (actor, reference, rollout)."""
    reward_workers: int = 1
    """Processes that run the scoring functions."""
    seed: int = 0
    """Seed of the data order, the generated task and the sampling."""
    loggers: tuple[str, ...] = ("console", "jsonl")
    """Metric sinks (``hf_algos.tracking.LOGGERS``)."""


class Roles(NamedTuple):
    """The three views of the fused worker group, and the group and its pool (to shut down)."""

    actor: Any
    ref: Any
    rollout: Any
    group: WorkerGroup
    pool: RayResourcePool


VAL_SEED_OFFSET = 10_000
"""Generated held-out prompts use ``seed + VAL_SEED_OFFSET`` (training ones ``seed``)."""


def prepare(config: OnlineDPOConfig) -> tuple[str, list[str], list[str]]:
    """The model directory, training and held-out prompt files; made in ``workdir`` when the
    config gives none (held-out rows only when the training rows are generated too)."""
    workdir = Path(config.workdir)
    model_path = config.model_path
    if model_path is None:
        model_path = str(build_tiny_model(workdir / "tiny_model", "qwen2", config.seed))
        build_char_tokenizer(model_path, chat_template=None)
        if config.warmup_steps > 0:
            # Other rows than the DPO prompts': a seed of their own.
            rows = make_reverse_letters_rows(4096, config.word_length, config.seed + 1)
            sft_warmup(model_path, rows, config.warmup_steps, lr=config.warmup_lr)
    files, val_files = list(config.train_files), list(config.val_files)
    if not files:
        rows = make_reverse_letters_rows(4096, length=config.word_length, seed=config.seed)
        files = [str(write_rows(rows, workdir / "data" / "train.jsonl"))]
        if not val_files and config.eval_every > 0:
            seed = config.seed + VAL_SEED_OFFSET
            rows = make_reverse_letters_rows(config.eval_prompts, config.word_length, seed)
            val_files = [str(write_rows(rows, workdir / "data" / "val.jsonl"))]
    return model_path, files, val_files


class RoleConfigs(NamedTuple):
    """The configs of the fused group's roles (built and checked in the driver)."""

    actor: ActorConfig
    """The policy, updated with the DPO loss."""
    engine: EngineConfig
    """The reference's engine (the actor's, frozen)."""
    rollout: RolloutConfig
    """The sampler, on the same model."""


def role_configs(config: OnlineDPOConfig, model_path: str, pad_token_id: int) -> RoleConfigs:
    """The actor, reference and rollout configs; starts no process (the tests build these)."""
    engine = EngineConfig(
        model=ModelConfig(path=model_path, dtype=config.dtype),  # type: ignore[arg-type]
        optim=config.optim,
        micro_batch=MicroBatchConfig(micro_batch_size=config.micro_batch_size),
    )
    # One optimizer step per batch of pairs: a mini-batch as large as the most pairs a step has.
    actor = ActorConfig(
        engine=engine, ppo_mini_batch_size=2 * config.prompts_per_step, row_group_size=2
    )
    rollout = RolloutConfig(
        backend=config.rollout_backend,
        model_path=model_path,
        dtype=config.dtype,
        pad_token_id=pad_token_id,
        seed=config.seed,
        device="cuda" if config.use_gpu else "cpu",
    )
    return RoleConfigs(actor, engine, rollout)


def build_roles(config: OnlineDPOConfig, model_path: str, pad_token_id: int) -> Roles:
    """Actor (with the DPO loss), reference and rollout, fused in one group of processes."""
    configs = role_configs(config, model_path, pad_token_id)
    loss = functools.partial(dpo_loss_fn, beta=config.beta, loss_type=config.loss_type)
    roles: dict[str, ClassWithInitArgs] = {
        "actor": RayClassWithInitArgs(ActorWorker, configs.actor, loss),
        "ref": RayClassWithInitArgs(ReferenceWorker, configs.engine),
        "rollout": RayClassWithInitArgs(RolloutWorker, configs.rollout),
    }
    pool = RayResourcePool([config.workers], use_gpu=config.use_gpu, name_prefix="online_dpo")
    group = make_worker_group(
        pool, create_colocated_worker_cls_fused(roles), name_prefix="online_dpo"
    )
    views: dict[str, Any] = group.spawn(roles)  # role name -> the group's view of that role
    for role in ("actor", "ref", "rollout"):
        views[role].init_model()
    views["rollout"].update_weights()  # from the fused actor, in process
    return Roles(views["actor"], views["ref"], views["rollout"], group, pool)


def take_metrics(output: DataProto, metrics: Metrics) -> DataProto:
    """Move a worker output's metrics into ``metrics`` (so ``union`` sees only columns)."""
    metrics.update(merge_worker_metrics([output]))
    output.meta_info.pop("metrics", None)
    output.meta_info.pop("reward_errors", None)
    return output


def online_dpo_step(
    roles: Roles, reward: RewardManager, prompts: DataProto, sampling: SamplingConfig, workers: int
) -> Metrics:
    """Sample, score, pair, reference log-prob, DPO update, weight sync: one step."""
    metrics: Metrics = {}
    prompts.meta_info[fields.SAMPLING] = sampling  # the object itself reaches the workers
    batch = take_metrics(roles.rollout.generate_sequences(prompts), metrics)  # n rows a prompt
    batch = batch.union(take_metrics(reward.score(batch), metrics))  # token_level_scores
    scores = batch.batch[fields.TOKEN_LEVEL_SCORES].sum(-1)  # type: ignore[index]
    metrics["score/mean"] = float(scores.mean())

    pairs = make_preference_batch(batch)  # rows: chosen, rejected, chosen, rejected, ...
    keep = len(pairs) // (2 * workers) * (2 * workers)  # whole pairs on every worker
    metrics["pairs"] = keep // 2
    if keep == 0:
        return metrics  # every prompt's responses scored alike: nothing to prefer
    pairs = pairs.slice(0, keep)
    pairs = pairs.union(take_metrics(roles.ref.compute_ref_log_prob(pairs), metrics))
    take_metrics(roles.actor.update_actor(pairs), metrics)  # actor/dpo_loss, reward_margin...
    roles.rollout.update_weights()
    return metrics


def evaluate(
    roles: Roles, reward: RewardManager, prompts: DataProto, sampling: SamplingConfig
) -> Metrics:
    """Mean score of responses sampled for the held-out ``prompts``: ``val/score/mean``."""
    prompts = prompts.slice(0, len(prompts))  # a copy: the sampling config goes in meta_info
    prompts.meta_info[fields.SAMPLING] = sampling
    batch = take_metrics(roles.rollout.generate_sequences(prompts), {})
    batch = batch.union(take_metrics(reward.score(batch), {}))
    scores = batch.batch[fields.TOKEN_LEVEL_SCORES].sum(-1)  # type: ignore[index]
    return {"val/score/mean": float(scores.mean())}


def endless(loader: StatefulDataLoader) -> Iterator[DataProto]:
    """The loader's batches, epoch after epoch (reshuffled each epoch)."""
    while True:
        yield from loader


def load_online_dpo_config(path: Path, overrides: Sequence[str]) -> OnlineDPOConfig:
    """The recipe's validated config: the YAML at ``path`` with ``key=value`` overrides."""
    return load_config(OnlineDPOConfig, path, overrides)


def sampling_config(
    config: OnlineDPOConfig, eos_token_id: int, n: int, seed: int
) -> SamplingConfig:
    """The rollout's sampling settings for ``n`` responses a prompt, seeded by ``seed``."""
    return SamplingConfig(
        n=n,
        temperature=config.temperature,
        max_new_tokens=config.max_new_tokens,
        eos_token_id=eos_token_id,
        seed=seed,
    )


def run(overrides: Sequence[str] = (), config_path: Path = CONFIG_PATH) -> list[Metrics]:
    """Train as the config says, save the final model; returns every step's metrics, each
    with its ``step``: the held-out score ``val/score/mean`` in the steps that evaluate, and
    first, when ``eval_every > 0``, a step 0 entry with the score before training."""
    config = load_online_dpo_config(config_path, overrides)
    model_path, files, val_files = prepare(config)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or model_path)
    data_config = RLDatasetConfig(max_prompt_length=config.max_prompt_length)
    data = RLDataset(files, tokenizer, data_config)
    loader = StatefulDataLoader(data, config.prompts_per_step, True, config.seed, drop_last=True)
    val_prompts = None
    if val_files and config.eval_every > 0:
        val_data = RLDataset(val_files, tokenizer, data_config)
        val_loader = StatefulDataLoader(val_data, config.eval_prompts, False, drop_last=False)
        val_prompts = next(iter(val_loader))
    # The same seed at every evaluation: only the policy changes between them.
    val_seed = config.seed * 1_000_003  # step 0's: training steps use 1, 2, ...
    val_sampling = sampling_config(config, tokenizer.eos_token_id, config.eval_samples, val_seed)
    register_reward()  # the generated prompts are the quickstart's task, scored by its reward
    reward = RewardManager(tokenizer, RewardSection(num_workers=config.reward_workers))
    roles = build_roles(config, model_path, tokenizer.pad_token_id)
    log_dir = Path(config.workdir) / "logs"
    tracking = Tracking("online_dpo", "run", config.loggers, log_dir, config_to_dict(config))
    history: list[Metrics] = []
    try:
        if val_prompts is not None:
            before = evaluate(roles, reward, val_prompts, val_sampling)
            tracking.log(before, 0)
            history.append({"step": 0, **before})
        batches = endless(loader)
        for step in range(1, config.steps + 1):
            # seed from the step: a rerun samples the same responses
            seed = config.seed * 1_000_003 + step
            sampling = sampling_config(
                config, tokenizer.eos_token_id, config.samples_per_prompt, seed
            )
            metrics = online_dpo_step(roles, reward, next(batches), sampling, config.workers)
            if val_prompts is not None and (step % config.eval_every == 0 or step == config.steps):
                metrics.update(evaluate(roles, reward, val_prompts, val_sampling))
            tracking.log(metrics, step)
            history.append({"step": step, **metrics})
        model_dir = Path(config.workdir) / "model"
        roles.actor.export_hf(str(model_dir))
        tokenizer.save_pretrained(model_dir)
    finally:
        tracking.finish()
        reward.close()
        roles.group.kill()
        roles.pool.release()
    print(f"{len(history)} steps; model: {model_dir}; metrics: {tracking.run_dir}")
    return history


if __name__ == "__main__":  # the guard matters: vLLM starts its engine in subprocesses
    args = parse_recipe_args(__doc__, CONFIG_PATH)
    run(args.overrides, args.config)
