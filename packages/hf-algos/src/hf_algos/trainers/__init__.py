"""Trainers (drivers): PPO and its critic-free relatives, DPO (offline and online), SFT."""

from hf_algos.trainers.base import Trainer
from hf_algos.trainers.ppo import PPOTrainer
from hf_algos.trainers.roles import RoleGroups, SyncActorWorker, build_role_groups

__all__ = ["PPOTrainer", "RoleGroups", "SyncActorWorker", "Trainer", "build_role_groups"]
