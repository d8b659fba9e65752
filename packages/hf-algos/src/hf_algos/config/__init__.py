"""Trainer configuration: typed sections, YAML + dotted overrides, validation before start."""

from hf_algos.config.loading import (
    apply_overrides,
    build_config,
    config_to_dict,
    load_config,
    parse_override,
    read_yaml,
)
from hf_algos.config.sections import (
    ActorSection,
    AlgorithmSection,
    CriticSection,
    DataSection,
    DPOSection,
    FilterGroupsSection,
    KLControlSection,
    RewardSection,
    RolloutSection,
    TrainerSection,
)
from hf_algos.config.trainers import DPOConfig, RLConfig, SFTConfig
from hf_algos.config.validation import (
    check_estimator,
    check_mini_batches,
    validate_dpo_config,
    validate_rl_config,
    validate_sft_config,
)

__all__ = [
    "ActorSection",
    "AlgorithmSection",
    "CriticSection",
    "DPOConfig",
    "DPOSection",
    "DataSection",
    "FilterGroupsSection",
    "KLControlSection",
    "RLConfig",
    "RewardSection",
    "RolloutSection",
    "SFTConfig",
    "TrainerSection",
    "apply_overrides",
    "build_config",
    "check_estimator",
    "check_mini_batches",
    "config_to_dict",
    "load_config",
    "parse_override",
    "read_yaml",
    "validate_dpo_config",
    "validate_rl_config",
    "validate_sft_config",
]
