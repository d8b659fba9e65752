"""Trainer configuration: typed sections, YAML + overrides on OmegaConf, verl aliases, checks."""

from hf_algos.config.actor import ActorSection
from hf_algos.config.algorithm import AlgorithmSection, FilterGroupsSection, KLControlSection
from hf_algos.config.aliases import VERL_ALIASES, Alias, VerlKeysNoEffect
from hf_algos.config.correction import RolloutCorrectionSection
from hf_algos.config.critic import CriticSection
from hf_algos.config.cross_checks import (
    check_estimator,
    check_mini_batches,
    validate_dpo_config,
    validate_rl_config,
    validate_sft_config,
)
from hf_algos.config.data import CurriculumSection, DataSection
from hf_algos.config.dpo import DPOSection
from hf_algos.config.loading import (
    VARS_KEY,
    compose_config,
    config_to_dict,
    instantiate_config,
    load_config,
    load_mapping,
    merge_config,
    resolve_config,
)
from hf_algos.config.multiturn import MultiTurnSection
from hf_algos.config.reward import RewardSection
from hf_algos.config.rollout import RolloutSection
from hf_algos.config.root import DPOConfig, RLConfig, SFTConfig
from hf_algos.config.trainer import TrainerSection

__all__ = [
    "VARS_KEY",
    "VERL_ALIASES",
    "ActorSection",
    "AlgorithmSection",
    "Alias",
    "CriticSection",
    "CurriculumSection",
    "DPOConfig",
    "DPOSection",
    "DataSection",
    "FilterGroupsSection",
    "KLControlSection",
    "MultiTurnSection",
    "RLConfig",
    "RewardSection",
    "RolloutCorrectionSection",
    "RolloutSection",
    "SFTConfig",
    "TrainerSection",
    "VerlKeysNoEffect",
    "check_estimator",
    "check_mini_batches",
    "compose_config",
    "config_to_dict",
    "instantiate_config",
    "load_config",
    "load_mapping",
    "merge_config",
    "resolve_config",
    "validate_dpo_config",
    "validate_rl_config",
    "validate_sft_config",
]
