"""Root configurations of the trainers, and the checks that span several sections.

:func:`validate_rl_config` (and the DPO / SFT counterparts) run in the driver before any
worker starts; every error names the numbers involved and a value that works.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hf_algos.config.sections import (
    ActorSection,
    AlgorithmConfig,
    CriticSection,
    DataConfig,
    RewardConfig,
    RolloutSection,
    TrainerSection,
    _positive,
)
from hf_engines.config import ConfigError, MicroBatchConfig

CRITIC_ESTIMATORS = frozenset({"gae"})
"""Estimators that need a value model (a ``critic`` section)."""


@dataclass(frozen=True)
class RLConfig:
    """PPO and its critic-free relatives (GRPO, RLOO, REINFORCE++, ReMax): one driver."""

    actor: ActorSection
    """The policy."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts."""
    rollout: RolloutSection = field(default_factory=RolloutSection)
    """Generation."""
    critic: CriticSection | None = None
    """The value model; required by ``algorithm.adv_estimator=gae``, unused otherwise."""
    reference: bool = True
    """Keep a frozen copy of the initial policy for KL terms (``ref_log_prob``)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Scoring."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages and the reward KL penalty."""
    trainer: TrainerSection = field(default_factory=TrainerSection)
    """Steps, placement, logging, checkpoints."""

    def __post_init__(self) -> None:
        validate_rl_config(self)


@dataclass(frozen=True)
class DPOSection:
    """DPO loss and, for online DPO, how pairs are made."""

    beta: float = 0.1
    """Inverse temperature of the implicit reward."""
    loss_type: str = "sigmoid"
    """DPO loss variant in ``hf_algos.dpo`` (sigmoid, ipo, hinge, ...)."""
    label_smoothing: float = 0.0
    """Conservative-DPO label noise."""
    online: bool = False
    """Sample ``rollout.n`` responses per prompt, score them and pair best against worst."""
    mini_batch_size: int = 8
    """Pairs per optimizer step, over all ranks."""

    def __post_init__(self) -> None:
        _positive("dpo.beta", self.beta)
        _positive("dpo.mini_batch_size", self.mini_batch_size)
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"dpo.label_smoothing={self.label_smoothing!r} must be in [0, 0.5)")


@dataclass(frozen=True)
class DPOConfig:
    """Offline DPO on preference pairs, or online DPO on sampled and scored responses."""

    actor: ActorSection
    """The policy (``ppo_mini_batch_size`` is unused; see ``dpo.mini_batch_size``)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Preference pairs (offline: ``prompt``/``chosen``/``rejected``) or prompts (online);
    ``train_batch_size`` counts pairs (offline) or prompts (online)."""
    dpo: DPOSection = field(default_factory=DPOSection)
    """The loss."""
    rollout: RolloutSection = field(default_factory=RolloutSection)
    """Online DPO only: sampling (``n`` >= 2 responses per prompt)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Online DPO only: scoring."""
    max_response_length: int = 64
    """Offline: chosen / rejected responses are right-padded (and cut) to this length."""
    trainer: TrainerSection = field(default_factory=TrainerSection)
    """Steps, placement, logging, checkpoints."""

    def __post_init__(self) -> None:
        validate_dpo_config(self)


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning on prompt + response rows (next-token loss on the response)."""

    actor: ActorSection
    """The model (``ppo_mini_batch_size`` is the rows per optimizer step)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Rows with the prompt (``prompt_key``) and the target (``response_key``)."""
    response_key: str = "response"
    """Column holding the target response text."""
    max_response_length: int = 64
    """Responses are right-padded (and cut) to this many tokens."""
    loss_mask: Literal["response", "all"] = "response"
    """Train on the response tokens only, or on prompt and response."""
    trainer: TrainerSection = field(default_factory=TrainerSection)
    """Steps, placement, logging, checkpoints."""

    def __post_init__(self) -> None:
        _positive("max_response_length", self.max_response_length)
        check_mini_batches(
            "actor",
            self.data.train_batch_size,
            self.actor.ppo_mini_batch_size,
            self.actor.engine.micro_batch,
            self.trainer.n_workers,
            "data.train_batch_size",
        )
        check_tokenizer_source(self.data, self.actor)


# ---------------------------------------------------------------------------- checks


def check_mini_batches(
    role: str,
    rows: int,
    mini_batch_size: int,
    micro_batch: MicroBatchConfig,
    world_size: int,
    rows_name: str,
) -> None:
    """Rows of a step must split into whole mini-batches, ranks and micro-batches.

    ``rows`` is the step's row count (named ``rows_name`` in the message).
    """
    if rows % world_size != 0:
        raise ConfigError(
            f"{rows_name} = {rows} rows per step cannot be split evenly over "
            f"{world_size} {role} workers (trainer.n_workers); use a multiple of {world_size} "
            f"rows or {_divisors_text(rows)} workers"
        )
    if mini_batch_size > rows or rows % mini_batch_size != 0:
        raise ConfigError(
            f"{role}.ppo_mini_batch_size={mini_batch_size} does not divide the {rows} rows of a "
            f"step ({rows_name}); choose one of {_divisors_text(rows)}"
        )
    try:
        micro_batch.validate_for(mini_batch_size, world_size)
    except ConfigError as error:
        raise ConfigError(
            f"{role}: {error} (mini-batch = {role}.ppo_mini_batch_size={mini_batch_size}, "
            f"data-parallel size = trainer.n_workers={world_size}; micro-batch = "
            f"{role}.engine.micro_batch)"
        ) from None


def _divisors_text(n: int) -> str:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return ", ".join(map(str, divisors))


def validate_rl_config(config: RLConfig) -> None:
    """Checks across sections of an :class:`RLConfig`; raise :class:`ConfigError` naming the fix."""
    trainer, algorithm = config.trainer, config.algorithm
    rows = config.data.train_batch_size * config.rollout.n
    rows_name = (
        f"data.train_batch_size x rollout.n = {config.data.train_batch_size} x {config.rollout.n}"
    )
    check_mini_batches(
        "actor",
        rows,
        config.actor.ppo_mini_batch_size,
        config.actor.engine.micro_batch,
        trainer.n_workers,
        rows_name,
    )
    estimator = algorithm.adv_estimator
    if estimator in CRITIC_ESTIMATORS and config.critic is None:
        raise ConfigError(
            f"algorithm.adv_estimator={estimator!r} needs a value model: add a critic section "
            "(critic.engine.model...), or use a critic-free estimator such as grpo"
        )
    if config.critic is not None:
        if estimator not in CRITIC_ESTIMATORS:
            raise ConfigError(
                f"a critic section is set but algorithm.adv_estimator={estimator!r} does not "
                "use values; remove the critic section or set adv_estimator=gae"
            )
        check_mini_batches(
            "critic",
            rows,
            config.critic.ppo_mini_batch_size,
            config.critic.engine.micro_batch,
            trainer.n_workers,
            rows_name,
        )
    if estimator in ("grpo", "rloo") and config.rollout.n < 2:
        raise ConfigError(
            f"algorithm.adv_estimator={estimator!r} compares responses within a prompt's "
            f"group, so it needs rollout.n >= 2 (got {config.rollout.n}); e.g. rollout.n=4"
        )
    needs_ref = config.actor.use_kl_loss or algorithm.use_kl_in_reward
    if needs_ref and not config.reference:
        raise ConfigError(
            "actor.use_kl_loss or algorithm.use_kl_in_reward needs the reference policy; "
            "set reference=true or turn both off"
        )
    _check_loop(trainer, bool(config.data.val_files))
    _check_placement(trainer, rows)
    check_tokenizer_source(config.data, config.actor)


def check_tokenizer_source(data: DataConfig, actor: ActorSection) -> None:
    """A tokenizer must come from ``data.tokenizer_path`` or the actor's model directory."""
    if data.tokenizer_path is None and actor.engine.model.path is None:
        raise ConfigError(
            "no tokenizer: actor.engine.model.hf_config builds a random model without one; set "
            "data.tokenizer_path to a local tokenizer directory (tokenizer.save_pretrained(dir))"
        )


def _check_loop(trainer: TrainerSection, has_val: bool) -> None:
    if trainer.test_freq > 0 and not has_val:
        raise ConfigError(
            f"trainer.test_freq={trainer.test_freq} asks for validation but data.val_files is "
            "empty; add validation files or set trainer.test_freq=0"
        )
    if trainer.val_before_train and not has_val:
        raise ConfigError("trainer.val_before_train needs data.val_files")


def _check_placement(trainer: TrainerSection, rows: int) -> None:
    if trainer.placement == "separate":
        rollout_workers = trainer.rollout_workers or trainer.n_workers
        if rows % rollout_workers != 0:
            raise ConfigError(
                f"{rows} rows per step cannot be split evenly over trainer.rollout_workers="
                f"{rollout_workers}; choose one of {_divisors_text(rows)}"
            )
    elif trainer.rollout_workers not in (None, trainer.n_workers):
        raise ConfigError(
            f"trainer.rollout_workers={trainer.rollout_workers} only applies to "
            "placement='separate'; in the hybrid placement rollout shares the actor's "
            f"{trainer.n_workers} workers. Remove it or set placement=separate"
        )


def validate_dpo_config(config: DPOConfig) -> None:
    """Checks across sections of a :class:`DPOConfig`."""
    pairs = config.data.train_batch_size
    if config.dpo.online and config.rollout.n < 2:
        raise ConfigError(
            f"online DPO pairs the best and worst of rollout.n responses per prompt; "
            f"rollout.n={config.rollout.n} must be >= 2"
        )
    # A pair is two rows (chosen, rejected) that must stay in one micro-batch.
    micro = config.actor.engine.micro_batch
    if micro.max_tokens is not None or (micro.micro_batch_size or 0) % 2 != 0:
        raise ConfigError(
            f"DPO keeps each pair's chosen and rejected rows in one micro-batch, so "
            f"actor.engine.micro_batch.micro_batch_size must be even and max_tokens unset "
            f"(got micro_batch_size={micro.micro_batch_size}, max_tokens={micro.max_tokens}); "
            f"e.g. micro_batch_size=2"
        )
    check_mini_batches(
        "dpo",
        2 * pairs,
        2 * config.dpo.mini_batch_size,
        micro,
        config.trainer.n_workers,
        f"2 x data.train_batch_size = 2 x {pairs} pair rows",
    )
    check_tokenizer_source(config.data, config.actor)
    _check_loop(config.trainer, bool(config.data.val_files))
