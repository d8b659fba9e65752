"""Trainers (drivers): PPO and its critic-free relatives, DPO (offline and online), SFT."""

from hf_algos.trainers.base import RestartsExhaustedError, Trainer
from hf_algos.trainers.dpo import DPOTrainer
from hf_algos.trainers.groups import (
    ActorGroup,
    CriticGroup,
    ReferenceGroup,
    RewardModelGroup,
    RewardScorer,
    RolloutGroup,
)
from hf_algos.trainers.ppo import PPOTrainer
from hf_algos.trainers.roles import RoleGroups, SyncActorWorker, build_role_groups
from hf_algos.trainers.sft import SFTTrainer

__all__ = [
    "ActorGroup",
    "CriticGroup",
    "DPOTrainer",
    "PPOTrainer",
    "ReferenceGroup",
    "RestartsExhaustedError",
    "RewardModelGroup",
    "RewardScorer",
    "RoleGroups",
    "RolloutGroup",
    "SFTTrainer",
    "SyncActorWorker",
    "Trainer",
    "build_role_groups",
]
