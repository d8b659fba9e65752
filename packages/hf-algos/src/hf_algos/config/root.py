"""Root configurations of the trainers: one frozen dataclass per trainer, over the sections.

Building one validates it: each section checks its own values, then ``__post_init__`` runs
the checks across sections (:mod:`hf_algos.config.cross_checks`), in the driver, before any
worker starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hf_algos.config.actor import ActorSection
from hf_algos.config.algorithm import AlgorithmSection
from hf_algos.config.critic import CriticSection
from hf_algos.config.cross_checks import (
    validate_dpo_config,
    validate_rl_config,
    validate_sft_config,
)
from hf_algos.config.data import DataSection
from hf_algos.config.dpo import DPOSection
from hf_algos.config.reward import RewardSection
from hf_algos.config.rollout import RolloutSection
from hf_algos.config.trainer import TrainerSection


@dataclass(frozen=True)
class RLConfig:
    """PPO and its critic-free relatives (GRPO, RLOO, REINFORCE++, ReMax): one driver."""

    actor: ActorSection
    """The policy."""
    data: DataSection = field(default_factory=DataSection)
    """Prompts."""
    rollout: RolloutSection = field(default_factory=RolloutSection)
    """Generation."""
    critic: CriticSection | None = None
    """The value model; required by estimators that read ``values`` (``gae``), refused by the
    others."""
    reference: bool = True
    """Keep a frozen copy of the initial policy for KL terms (``ref_log_prob``)."""
    reward: RewardSection = field(default_factory=RewardSection)
    """Scoring."""
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    """Advantages and the reward KL penalty."""
    trainer: TrainerSection = field(default_factory=TrainerSection)
    """Steps, placement, logging, checkpoints."""

    def __post_init__(self) -> None:
        validate_rl_config(
            actor=self.actor,
            data=self.data,
            rollout=self.rollout,
            critic=self.critic,
            reference=self.reference,
            algorithm=self.algorithm,
            trainer=self.trainer,
            reward_model=self.reward.model,
        )


@dataclass(frozen=True)
class DPOConfig:
    """Offline DPO on preference pairs, or online DPO on sampled and scored responses."""

    actor: ActorSection
    """The policy (``ppo_mini_batch_size`` is unused; see ``dpo.mini_batch_size``)."""
    data: DataSection = field(default_factory=DataSection)
    """Preference pairs (offline: ``prompt``/``chosen``/``rejected``) or prompts (online);
    ``train_batch_size`` counts pairs (offline) or prompts (online)."""
    dpo: DPOSection = field(default_factory=DPOSection)
    """The loss."""
    rollout: RolloutSection = field(default_factory=RolloutSection)
    """Online DPO only: sampling (``n`` >= 2 responses per prompt)."""
    reward: RewardSection = field(default_factory=RewardSection)
    """Online DPO only: scoring."""
    max_response_length: int = 64
    """Offline: chosen / rejected responses are right-padded (and cut) to this length."""
    trainer: TrainerSection = field(default_factory=TrainerSection)
    """Steps, placement, logging, checkpoints."""

    def __post_init__(self) -> None:
        validate_dpo_config(
            actor=self.actor,
            data=self.data,
            dpo=self.dpo,
            rollout=self.rollout,
            trainer=self.trainer,
        )


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning on prompt + response rows (next-token loss on the response)."""

    actor: ActorSection
    """The model (``ppo_mini_batch_size`` is the rows per optimizer step)."""
    data: DataSection = field(default_factory=DataSection)
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
        validate_sft_config(
            actor=self.actor,
            data=self.data,
            max_response_length=self.max_response_length,
            trainer=self.trainer,
        )
