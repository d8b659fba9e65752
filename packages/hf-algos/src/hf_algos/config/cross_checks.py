"""Checks that span several sections of a trainer config, run before any worker starts.

Each section checks its own values (one module per section: :mod:`hf_algos.config.data`,
:mod:`hf_algos.config.actor`, ...); the checks here hold
sections against each other: every worker gets rows (nothing has to divide; DPO pairs
stay whole through ``UpdateConfig.row_group_size``), the advantage estimator against the
critic and ``rollout.n``, validation against ``data.val_files``. Every error is a
:class:`hf_controller.ConfigurationError` that names the numbers involved and a value that
works.

The root configs (:mod:`hf_algos.config.root`) call these from ``__post_init__``. So that
this module never imports them back, each check takes the sections it reads, not the root.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from hf_algos.config.correction import check_rollout_correction
from hf_algos.config.multiturn import check_multi_turn
from hf_algos.config.values import require_positive
from hf_controller import ConfigurationError
from hf_engines.config import check_sequence_parallel

if TYPE_CHECKING:  # the root configs pass their sections
    from hf_algos.advantages.registry import AdvantageEstimator
    from hf_algos.config.actor import ActorSection
    from hf_algos.config.algorithm import AlgorithmSection
    from hf_algos.config.critic import CriticSection
    from hf_algos.config.data import DataSection
    from hf_algos.config.dpo import DPOSection
    from hf_algos.config.rollout import RolloutSection
    from hf_algos.config.trainer import TrainerSection
    from hf_engines.config import EngineConfig


def check_mini_batches(role: str, rows: int, world_size: int, rows_name: str) -> None:
    """Every one of ``world_size`` workers must get at least one of the step's ``rows``.

    Nothing has to divide: ranks get balanced shards, mini-batches are balanced ranges of
    the global rows (a mini-batch larger than the step is the whole step) and the last
    micro-batch may be short (``hf_engines.workers.updates``).
    """
    if rows < world_size:
        raise ConfigurationError(
            f"{rows_name} = {rows} rows per step leave some of the {world_size} {role} "
            f"workers (trainer.n_workers) without a row; use at most {rows} workers or more "
            "rows per step"
        )


def check_megatron_layouts(engines: Mapping[str, EngineConfig | None], n_workers: int) -> None:
    """Megatron layouts the training pool's ``n_workers`` processes can take: each Megatron
    engine's tensor x pipeline size divides ``n_workers``, and all of them (actor, critic,
    reward model: keyed by config path in ``engines``) use one layout, since they share the
    worker processes and megatron-core keeps one parallel state per process. (The reference
    always runs in the actor's layout; LoRA on Megatron is refused by
    :func:`hf_engines.config.check_lora_backend`.)"""
    layouts: dict[str, tuple[int, int]] = {}
    for key, engine in engines.items():
        if engine is None or engine.backend != "megatron":
            continue
        tp = engine.megatron.tensor_model_parallel_size
        pp = engine.megatron.pipeline_model_parallel_size
        if n_workers % (tp * pp):
            raise ConfigurationError(
                f"{key}.megatron.tensor_model_parallel_size={tp} x pipeline_model_parallel_"
                f"size={pp} = {tp * pp} does not divide trainer.n_workers={n_workers} (each "
                f"data-parallel replica takes {tp * pp} workers); use a multiple of {tp * pp} "
                "workers or smaller sizes"
            )
        layouts[key] = (tp, pp)
    if not layouts:
        return
    first, layout = next(iter(layouts.items()))
    for key, (tp, pp) in layouts.items():
        if (tp, pp) != layout:
            raise ConfigurationError(
                f"{key}.megatron (tensor, pipeline) sizes ({tp}, {pp}) differ from {first}."
                f"megatron's {layout}: both run in the same worker processes and megatron-core "
                f"keeps one parallel layout per process; give {key}.megatron "
                f"tensor_model_parallel_size={layout[0]} and pipeline_model_parallel_size="
                f"{layout[1]}, or {key}.backend=fsdp"
            )


def check_estimator(
    algorithm: AlgorithmSection, critic: CriticSection | None, rollout: RolloutSection
) -> AdvantageEstimator:
    """``algorithm.adv_estimator`` is registered and gets what its entry says it reads.

    A critic section exactly when the estimator reads ``values``; ``rollout.n`` at least its
    ``min_group_size``. Returns the registry entry. (The registry imports torch: it is
    read when a config is instantiated, not when it is composed.)
    """
    from hf_algos.advantages.registry import ADVANTAGE_ESTIMATORS, get_advantage_estimator

    name = algorithm.adv_estimator
    if name not in ADVANTAGE_ESTIMATORS:
        raise ConfigurationError(
            f"algorithm.adv_estimator={name!r} is not a registered advantage estimator; choose "
            f"one of {', '.join(sorted(ADVANTAGE_ESTIMATORS))}, or register yours with "
            "hf_algos.advantages.register_advantage_estimator before building the config"
        )
    estimator = get_advantage_estimator(name)
    with_critic = sorted(n for n, e in ADVANTAGE_ESTIMATORS.items() if e.needs_critic)
    critic_free = sorted(n for n, e in ADVANTAGE_ESTIMATORS.items() if not e.needs_critic)
    if estimator.needs_critic and critic is None:
        raise ConfigurationError(
            f"algorithm.adv_estimator={name!r} reads values, so it needs a value model: add a "
            f"critic section (critic.engine.model...), or use a critic-free estimator "
            f"({', '.join(critic_free)})"
        )
    if critic is not None and not estimator.needs_critic:
        raise ConfigurationError(
            f"a critic section is set but algorithm.adv_estimator={name!r} does not use "
            f"values; remove the critic section or choose an estimator that reads them "
            f"({', '.join(with_critic)})"
        )
    if rollout.n < estimator.min_group_size:
        raise ConfigurationError(
            f"algorithm.adv_estimator={name!r} compares responses within a prompt's group, so "
            f"it needs rollout.n >= {estimator.min_group_size} (got {rollout.n}); "
            "e.g. rollout.n=4"
        )
    return estimator


def validate_rl_config(
    *,
    actor: ActorSection,
    data: DataSection,
    rollout: RolloutSection,
    critic: CriticSection | None,
    reference: bool,
    algorithm: AlgorithmSection,
    trainer: TrainerSection,
    reward_model: EngineConfig | None = None,
) -> None:
    """Checks across the sections of an :class:`~hf_algos.config.RLConfig`
    (``reward_model``: ``reward.model``, the reward model's engine when one scores).

    Raises :class:`~hf_controller.ConfigurationError` naming the fix.
    """
    rows = data.train_batch_size * rollout.n
    rows_name = f"data.train_batch_size x rollout.n = {data.train_batch_size} x {rollout.n}"
    check_mini_batches("actor", rows, trainer.n_workers, rows_name)
    engines = {"actor.engine": actor.engine, "reward.model": reward_model}
    if critic is not None:
        engines["critic.engine"] = critic.engine
    check_megatron_layouts(engines, trainer.n_workers)
    check_sequence_parallel(actor.engine, trainer.n_workers, "actor")
    if critic is not None:
        check_sequence_parallel(critic.engine, trainer.n_workers, "critic")
    check_estimator(algorithm, critic, rollout)
    if (actor.use_kl_loss or algorithm.use_kl_in_reward) and not reference:
        raise ConfigurationError(
            "actor.use_kl_loss or algorithm.use_kl_in_reward needs the reference policy; "
            "set reference=true or turn both off"
        )
    _check_loop(trainer, bool(data.val_files))
    _check_placement(trainer, rows)
    check_async(trainer, rollout, algorithm, actor)
    correction = algorithm.rollout_correction.resolved(trainer.async_mode)
    check_rollout_correction(correction, actor.use_rollout_log_probs)
    check_multi_turn(rollout.multi_turn, trainer.async_mode, rollout.partial)
    check_curriculum_run(data, trainer, algorithm, rollout)
    check_tokenizer_source(data, actor)


def check_curriculum_run(
    data: DataSection, trainer: TrainerSection, algorithm: AlgorithmSection, rollout: RolloutSection
) -> None:
    """A curriculum (``data.curriculum``) needs a run length in steps, and a step that
    trains on the prompts it drew just before: it cannot know the accuracy of prompts
    generated ahead (an async mode), of extra draws (dynamic sampling) or of episodes."""
    if data.curriculum is None:
        return
    if trainer.total_training_steps is None:
        raise ConfigurationError(
            "data.curriculum generates prompts without end, so epochs do not measure the "
            "run; set trainer.total_training_steps"
        )
    others = {
        "trainer.async_mode": trainer.async_mode != "off",
        "algorithm.filter_groups.enable": algorithm.filter_groups.enable,
        "rollout.multi_turn.enable": rollout.multi_turn.enable,
    }
    clashing = [name for name, on in others.items() if on]
    if clashing:
        raise ConfigurationError(
            f"data.curriculum advances on the accuracy of the prompts each step drew, which "
            f"{', '.join(clashing)} does not give; turn {' and '.join(clashing)} off, or "
            "train on data.train_files"
        )


def check_async(
    trainer: TrainerSection,
    rollout: RolloutSection,
    algorithm: AlgorithmSection,
    actor: ActorSection | None = None,
) -> None:
    """``trainer.async_mode`` needs its own rollout pool, refuses what it cannot pipeline,
    and refuses ``actor.use_rollout_log_probs`` (see :func:`check_async_log_probs`)."""
    mode = trainer.async_mode
    if rollout.partial and mode != "fully_async":
        raise ConfigurationError(
            f"rollout.partial=true continues generations across weight pushes, which only "
            f"trainer.async_mode='fully_async' does (got {mode!r}); set rollout.partial=false "
            "or trainer.async_mode=fully_async"
        )
    if mode == "off":
        return
    if trainer.placement != "separate" or trainer.backend != "ray":
        raise ConfigurationError(
            f"trainer.async_mode={mode!r} generates on the rollout's own processes while the "
            f"actor trains, so it needs trainer.placement=separate and trainer.backend=ray "
            f"(got {trainer.placement!r}, {trainer.backend!r}); set both, or async_mode=off"
        )
    if algorithm.filter_groups.enable:
        raise ConfigurationError(
            f"algorithm.filter_groups (dynamic sampling) draws a variable number of prompt "
            f"batches per step, which trainer.async_mode={mode!r} does not pipeline; turn "
            "one of them off"
        )
    from hf_algos.advantages.registry import get_advantage_estimator

    if get_advantage_estimator(algorithm.adv_estimator).needs_greedy_baseline:
        raise ConfigurationError(
            f"algorithm.adv_estimator={algorithm.adv_estimator!r} needs a greedy rollout with "
            f"the current weights each step, which trainer.async_mode={mode!r} does not "
            "pipeline; use grpo / rloo / gae, or async_mode=off"
        )
    if actor is not None:
        check_async_log_probs(mode, actor.use_rollout_log_probs)


def check_async_log_probs(mode: str, use_rollout_log_probs: bool) -> None:
    """An async step's samples come from an older policy: its ``old_log_probs`` must be the
    actor's own (recomputed), not the rollout's.

    With the stale rollout's log-probs as ``old_log_probs`` the PPO ratio of the (single)
    update is ``pi_now / pi_stale`` rather than 1: the clip range sits around the stale
    policy, and for a negative advantage the loss ``-A * ratio`` grows without bound where
    the policy has already moved towards the token (no dual clip, no gradient clip in the
    quickstart), which collapsed the quickstart benchmark's async runs to 0 accuracy
    (docs/benchmarks.md, "GRPO time to 0.9 over seeds, with the async modes"). Recomputed
    ``old_log_probs`` keep the PPO ratio at the current policy, and
    ``algorithm.rollout_correction`` weighs the lag instead (bounded).
    """
    if mode != "off" and use_rollout_log_probs:
        raise ConfigurationError(
            f"trainer.async_mode={mode!r} trains on samples of an older policy, and "
            "actor.use_rollout_log_probs=true would take that policy's log-probs as "
            "old_log_probs: the PPO ratio then starts away from 1 and is unbounded for "
            "negative advantages (async runs collapsed with it); set "
            "actor.use_rollout_log_probs=false (the actor recomputes them; "
            "algorithm.rollout_correction.mode=tis weighs the lag), or async_mode=off"
        )


def check_tokenizer_source(data: DataSection, actor: ActorSection) -> None:
    """A tokenizer must come from ``data.tokenizer_path`` or the actor's model directory;
    ``data.prompt_format=chat`` needs one with a chat template (read from its files, so a
    base model's tokenizer is refused here, before anything loads)."""
    if data.tokenizer_path is None and actor.engine.model.path is None:
        raise ConfigurationError(
            "no tokenizer: actor.engine.model.hf_config builds a random model without one; set "
            "data.tokenizer_path to a local tokenizer directory (tokenizer.save_pretrained(dir))"
        )
    if data.resolved_prompt_format != "chat":
        return
    from hf_algos.data.template_check import directory_has_chat_template, no_chat_template_error
    from hf_engines.hub import resolve_model_path

    try:
        if data.tokenizer_path is not None:
            directory = str(resolve_model_path(data.tokenizer_path, option="data.tokenizer_path"))
        else:
            directory = actor.engine.model.local_path() or ""
    except (ConfigurationError, OSError):  # not there yet: the loaded tokenizer decides
        return
    if directory and directory_has_chat_template(directory) is False:
        raise no_chat_template_error(directory)


def check_few_shot_trainer(data: DataSection, trainer: str) -> None:
    """``data.prompt_format=few_shot`` is for RL prompts; refuse it for ``trainer``'s rows
    (SFT, offline DPO), whose targets are given."""
    if data.prompt_format == "few_shot":
        raise ConfigurationError(
            f"data.prompt_format=few_shot puts solved examples before RL prompts (grpo, "
            f"ppo, eval, generate, online DPO); {trainer} rows carry their own targets: use "
            "data.prompt_format=raw (or chat) there"
        )


def _check_loop(trainer: TrainerSection, has_val: bool) -> None:
    _check_loggers(trainer)
    if trainer.test_freq > 0 and not has_val:
        raise ConfigurationError(
            f"trainer.test_freq={trainer.test_freq} asks for validation but data.val_files is "
            "empty; add validation files or set trainer.test_freq=0"
        )
    if trainer.val_before_train and not has_val:
        raise ConfigurationError("trainer.val_before_train needs data.val_files")
    if trainer.val_only and not has_val:
        raise ConfigurationError(
            "trainer.val_only (hybridflow eval) evaluates on data.val_files, which is empty; "
            "give the files (or reasoning_gym: specs) to evaluate on"
        )


def _check_loggers(trainer: TrainerSection) -> None:
    # Here, not in TrainerSection: composing a config must not import the tracking package.
    from hf_algos.tracking.loggers import LOGGERS

    unknown = [name for name in trainer.loggers if name not in LOGGERS]
    if unknown:
        raise ConfigurationError(
            f"trainer.loggers names unknown logger(s) {unknown}; choose from "
            f"{sorted(LOGGERS)} (or add one with hf_algos.tracking.register_logger)"
        )


def _check_placement(trainer: TrainerSection, rows: int) -> None:
    if trainer.placement == "separate":
        rollout_workers = trainer.rollout_workers or trainer.n_workers
        if rows < rollout_workers:
            raise ConfigurationError(
                f"{rows} rows per step leave some of trainer.rollout_workers="
                f"{rollout_workers} without a row; use at most {rows} rollout workers"
            )
    elif trainer.rollout_workers not in (None, trainer.n_workers):
        raise ConfigurationError(
            f"trainer.rollout_workers={trainer.rollout_workers} only applies to "
            "placement='separate'; in the hybrid placement rollout shares the actor's "
            f"{trainer.n_workers} workers. Remove it or set placement=separate"
        )


DPO_MICRO_BATCH_ROWS = 8
"""DPO's micro-batch when ``actor.engine.micro_batch`` sets neither field: 4 pairs (TRL's
``per_device_train_batch_size`` default is 8 rows too)."""


def validate_dpo_config(
    *,
    actor: ActorSection,
    data: DataSection,
    dpo: DPOSection,
    rollout: RolloutSection,
    trainer: TrainerSection,
) -> None:
    """Checks across the sections of a :class:`~hf_algos.config.DPOConfig`."""
    refuse_curriculum(data, "DPO")
    if rollout.multi_turn.enable:
        raise ConfigurationError(
            "rollout.multi_turn.enable=true is for the RL trainers (PPO / GRPO); DPO pairs "
            "single responses: set rollout.multi_turn.enable=false"
        )
    check_sequence_parallel(actor.engine, trainer.n_workers, "actor")
    pairs = data.train_batch_size
    if dpo.online and rollout.n < 2:
        raise ConfigurationError(
            f"online DPO pairs the best and worst of rollout.n responses per prompt; "
            f"rollout.n={rollout.n} must be >= 2"
        )
    # A pair is two rows (chosen, rejected) that must stay in one micro-batch; neither
    # field set means DPO_MICRO_BATCH_ROWS (the DPO trainer fills it in).
    micro = actor.engine.micro_batch
    odd = micro.micro_batch_size is not None and micro.micro_batch_size % 2
    if micro.max_tokens is not None or odd:
        raise ConfigurationError(
            f"DPO keeps each pair's chosen and rejected rows in one micro-batch, so "
            f"actor.engine.micro_batch.micro_batch_size must be even and max_tokens unset "
            f"(got micro_batch_size={micro.micro_batch_size}, max_tokens={micro.max_tokens}); "
            f"e.g. micro_batch_size=2, or leave both unset for {DPO_MICRO_BATCH_ROWS} rows"
        )
    if not dpo.online:  # online DPO trims its pairs to a multiple of the workers itself
        check_mini_batches(
            "dpo", pairs, trainer.n_workers, f"data.train_batch_size = {pairs} pairs"
        )
    check_megatron_layouts({"actor.engine": actor.engine}, trainer.n_workers)
    check_tokenizer_source(data, actor)
    if not dpo.online:
        check_few_shot_trainer(data, "offline DPO")
    _check_loop(trainer, bool(data.val_files))


def validate_sft_config(
    *, actor: ActorSection, data: DataSection, max_response_length: int, trainer: TrainerSection
) -> None:
    """Checks across the sections of an :class:`~hf_algos.config.SFTConfig`."""
    refuse_curriculum(data, "SFT")
    require_positive("max_response_length", max_response_length)
    check_mini_batches("actor", data.train_batch_size, trainer.n_workers, "data.train_batch_size")
    check_megatron_layouts({"actor.engine": actor.engine}, trainer.n_workers)
    check_sequence_parallel(actor.engine, trainer.n_workers, "actor")
    check_tokenizer_source(data, actor)
    check_few_shot_trainer(data, "SFT")
    _check_loggers(trainer)


def refuse_curriculum(data: DataSection, trainer: str) -> None:
    """Only the RL trainers hand scores back to a curriculum (``data.curriculum``)."""
    if data.curriculum is not None:
        raise ConfigurationError(
            f"data.curriculum advances on the RL trainers' training scores, which {trainer} "
            "does not hand back; give data.train_files instead (a reasoning_gym: spec "
            "generates rows at fixed settings)"
        )
