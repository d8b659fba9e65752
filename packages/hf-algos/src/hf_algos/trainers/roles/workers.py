"""The worker each role runs: its class and config, built from the role's config section.

Each function returns the :class:`~hf_controller.RayClassWithInitArgs` that
:func:`~hf_algos.trainers.roles.groups.build_role_groups` places: the actor
(:class:`~hf_algos.trainers.roles.sync_actor.SyncActorWorker` with its loss), the frozen reference,
the critic, a reward model and the rollout. Two settings of the run reach every engine here:
the device (``trainer.use_gpu``, :func:`engine_on_device`) and the schedule's length
(:func:`with_run_length`, from :func:`optimizer_steps`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

from transformers import PreTrainedTokenizerBase

from hf_algos.config.actor import ActorSection
from hf_algos.config.correction import RolloutCorrectionSection
from hf_algos.config.critic import CriticSection
from hf_algos.config.keywords import build_from, keyword_names, section_kwargs
from hf_algos.config.rollout import RolloutSection
from hf_algos.config.trainer import TrainerSection
from hf_algos.losses import critic_loss, ppo_actor_loss
from hf_algos.trainers.ppo.multiturn import rollout_multi_turn
from hf_algos.trainers.roles.sync_actor import SyncActorWorker
from hf_controller import ConfigurationError, RayClassWithInitArgs
from hf_engines import EngineConfig, LossFn
from hf_engines.config import hf_config_dict
from hf_engines.precision import resolve_auto_dtype, with_compute_dtype
from hf_engines.workers import (
    ActorConfig,
    CriticConfig,
    CriticWorker,
    ReferenceWorker,
    RewardModelWorker,
)
from hf_engines.workers.updates import mini_batch_ranges
from hf_rollout import RolloutConfig
from hf_rollout.workers import RolloutWorker


def engine_on_device(engine: EngineConfig, trainer: TrainerSection, key: str) -> EngineConfig:
    """``engine`` computing where ``trainer.use_gpu`` says: its ``device="auto"`` becomes
    ``cuda`` or ``cpu``, so that a worker without a visible GPU fails instead of training on
    the CPU, and its ``fsdp.param_dtype='auto'`` the dtype it means there (announced in one
    line). An explicit device that contradicts ``trainer.use_gpu`` is refused; ``key`` is
    the engine's config path in errors (``actor.engine``)."""
    placed = _engine_on_device(engine, trainer, key)
    if placed.backend != "fsdp":  # Megatron computes in model.dtype; it reads no fsdp keys
        return placed
    resolved, choice = with_compute_dtype(placed, "cuda" if trainer.use_gpu else "cpu")
    if choice is not None:
        announce(choice.line())
    return resolved


@functools.cache
def announce(line: str) -> None:
    """Print ``line`` once per driver process (the actor and its reference resolve the same
    ``auto`` dtype; the run says it once)."""
    print(line, flush=True)


def _engine_on_device(engine: EngineConfig, trainer: TrainerSection, key: str) -> EngineConfig:
    """``engine`` with ``device='auto'`` made ``cuda`` or ``cpu`` (:func:`engine_on_device`)."""
    section = "megatron" if engine.backend == "megatron" else "fsdp"
    current = engine.megatron.device if section == "megatron" else engine.fsdp.device
    wanted: Literal["cuda", "cpu"] = "cuda" if trainer.use_gpu else "cpu"
    if current == wanted:
        return engine
    if current != "auto":
        raise ConfigurationError(
            f"{key}.{section}.device={current!r} contradicts "
            f"trainer.use_gpu={str(trainer.use_gpu).lower()}; set {key}.{section}.device"
            f"={wanted!r} (or 'auto'), or trainer.use_gpu={str(not trainer.use_gpu).lower()}"
        )
    if section == "megatron":
        megatron = dataclasses.replace(engine.megatron, device=wanted)
        return dataclasses.replace(engine, megatron=megatron)
    return dataclasses.replace(engine, fsdp=dataclasses.replace(engine.fsdp, device=wanted))


def optimizer_steps(
    trainer_steps: int, rows: int, mini_batch_rows: int, epochs: int = 1, row_group_size: int = 1
) -> int:
    """Optimizer steps of a run of ``trainer_steps`` steps that each update on ``rows`` rows
    in mini-batches of ``mini_batch_rows`` (``epochs`` passes): what a cosine schedule spans."""
    return trainer_steps * epochs * len(mini_batch_ranges(rows, mini_batch_rows, row_group_size))


def with_run_length(engine: EngineConfig, steps: int | None) -> EngineConfig:
    """``engine`` whose schedule ends at the run's last optimizer step (``steps``) when
    ``optim.total_steps`` is unset; as it is otherwise. A run no longer than the warm-up
    never reaches the decay: its end is put just past the warm-up."""
    optim = engine.optim
    if steps is None or optim.total_steps is not None:
        return engine
    total = max(steps, optim.warmup_steps + 1)
    return dataclasses.replace(engine, optim=dataclasses.replace(optim, total_steps=total))


def actor_class(
    actor: ActorSection,
    trainer: TrainerSection,
    mini_batch_rows: int | None = None,
    rollout_correction: RolloutCorrectionSection | None = None,
    run_steps: int | None = None,
) -> RayClassWithInitArgs:
    """The actor role (a :class:`~hf_algos.trainers.roles.sync_actor.SyncActorWorker`) with
    its loss;
    ``rollout_correction`` is applied in the loss when the old log-probs come from the
    update itself (see :func:`~hf_algos.trainers.ppo.trainer.old_log_probs_from_update`);
    ``run_steps``: the run's optimizer steps (:func:`optimizer_steps`)."""
    loss_fn = functools.partial(
        ppo_actor_loss,
        **section_kwargs(actor, keyword_names(ppo_actor_loss)),
        rollout_correction=rollout_correction,
    )
    return actor_class_with_loss(actor, trainer, loss_fn, mini_batch_rows, run_steps=run_steps)


def actor_class_with_loss(
    actor: ActorSection,
    trainer: TrainerSection,
    loss_fn: LossFn,
    mini_batch_rows: int | None = None,
    row_group_size: int = 1,
    run_steps: int | None = None,
) -> RayClassWithInitArgs:
    """The actor role with any engine loss function (DPO, SFT).

    ``row_group_size`` rows are kept together on one worker and in one mini-batch (2 for
    DPO's chosen/rejected pairs). ``run_steps``: the run's optimizer steps, where a cosine
    schedule without ``optim.total_steps`` ends (:func:`with_run_length`).
    """
    engine = with_run_length(actor.engine, run_steps)
    config = build_from(
        ActorConfig,
        actor,
        engine=engine_on_device(engine, trainer, "actor.engine"),
        ppo_mini_batch_size=mini_batch_rows or actor.ppo_mini_batch_size,
        seed=trainer.seed,
        row_group_size=row_group_size,
    )
    return RayClassWithInitArgs(SyncActorWorker, config, loss_fn)


def reference_class(actor: ActorSection, trainer: TrainerSection) -> RayClassWithInitArgs | None:
    """A frozen copy of the actor's initial model in the actor's engine layout (backend,
    FSDP or Megatron sizes: it shares the actor's processes, and Megatron's parallel state
    is one per process); ``None`` with LoRA, whose actor is its own reference (the base
    model with the adapters off)."""
    if actor.lora.enabled:
        return None
    engine = EngineConfig(
        model=actor.engine.model,
        fsdp=actor.engine.fsdp,
        micro_batch=actor.engine.micro_batch,
        backend=actor.engine.backend,
        megatron=actor.engine.megatron,
    )
    return RayClassWithInitArgs(ReferenceWorker, engine_on_device(engine, trainer, "actor.engine"))


def critic_class(
    critic: CriticSection, trainer: TrainerSection, run_steps: int | None = None
) -> RayClassWithInitArgs:
    """The value model, with the clipped value loss (``run_steps``: as for the actor)."""
    model = dataclasses.replace(critic.engine.model, head="value")
    engine = with_run_length(dataclasses.replace(critic.engine, model=model), run_steps)
    config = build_from(
        CriticConfig,
        critic,
        engine=engine_on_device(engine, trainer, "critic.engine"),
        seed=trainer.seed,
    )
    loss_fn = functools.partial(critic_loss, **section_kwargs(critic, keyword_names(critic_loss)))
    return RayClassWithInitArgs(CriticWorker, config, loss_fn)


def reward_model_class(engine: EngineConfig, trainer: TrainerSection) -> RayClassWithInitArgs:
    """A value-head reward model scored at the last response token."""
    model = dataclasses.replace(engine.model, head="value")
    placed = engine_on_device(dataclasses.replace(engine, model=model), trainer, "reward.model")
    return RayClassWithInitArgs(RewardModelWorker, placed)


def rollout_class(
    rollout: RolloutSection,
    actor: ActorSection,
    trainer: TrainerSection,
    tokenizer: PreTrainedTokenizerBase,
) -> RayClassWithInitArgs:
    """The rollout role on the actor's architecture (weights arrive by sync); each
    ``generate_sequences`` call brings its :func:`sampling_config`. With
    ``rollout.multi_turn.enable`` its samples are agent-loop episodes."""
    model = actor.engine.model
    config = build_from(
        RolloutConfig,
        rollout,
        model_path=model.local_path(),  # a model id resolved here, in the driver
        model_config=model.hf_config,
        trust_remote_code=model.trust_remote_code,
        dtype=rollout_dtype(rollout, actor, trainer),
        pad_token_id=tokenizer.pad_token_id,
        seed=trainer.seed,
        device="cuda" if trainer.use_gpu else "cpu",
        engine_kwargs=dict(rollout.engine_kwargs),
        multi_turn=rollout_multi_turn(rollout.multi_turn, tokenizer, model.trust_remote_code),
        prefix_cache_rows=rollout.multi_turn.prefix_cache_rows if rollout.multi_turn.enable else 0,
    )
    return RayClassWithInitArgs(RolloutWorker, config)


def rollout_dtype(rollout: RolloutSection, actor: ActorSection, trainer: TrainerSection) -> str:
    """The rollout's weights and compute dtype: ``rollout.dtype``; ``auto`` resolved for the
    run's device and the actor's model; unset, the actor's ``model.dtype``, or with the
    actor's ``fsdp.param_dtype='auto'`` (FSDP engine) what that resolves to (the rollout
    generates in the update's compute precision)."""
    wanted = rollout.dtype
    engine = actor.engine
    if wanted is None:
        follows = engine.backend == "fsdp" and engine.fsdp.param_dtype == "auto"
        wanted = "auto" if follows else engine.model.dtype
    if wanted != "auto":
        return wanted
    device = "cuda" if trainer.use_gpu else "cpu"
    choice = resolve_auto_dtype(device, hf_config_dict(engine.model))
    announce(choice.line())
    return choice.dtype
