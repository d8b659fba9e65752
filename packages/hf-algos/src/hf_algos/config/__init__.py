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
    AlgorithmConfig,
    CriticSection,
    DataConfig,
    KLControlConfig,
    RewardConfig,
    RolloutSection,
    TrainerSection,
)
from hf_algos.config.trainers import (
    DPOConfig,
    DPOSection,
    RLConfig,
    SFTConfig,
    check_mini_batches,
    validate_dpo_config,
    validate_rl_config,
)
from hf_engines.config import ConfigError

__all__ = [
    "ActorSection",
    "AlgorithmConfig",
    "ConfigError",
    "CriticSection",
    "DPOConfig",
    "DPOSection",
    "DataConfig",
    "KLControlConfig",
    "RLConfig",
    "RewardConfig",
    "RolloutSection",
    "SFTConfig",
    "TrainerSection",
    "apply_overrides",
    "build_config",
    "check_mini_batches",
    "config_to_dict",
    "load_config",
    "parse_override",
    "read_yaml",
    "validate_dpo_config",
    "validate_rl_config",
]
