"""Trainers (drivers): PPO and its critic-free relatives, DPO (offline and online), SFT.

Public names are imported on first use (``hf_algos._lazy``): the ``hybridflow`` command
reads :mod:`hf_algos.trainers.placement` (torch-free) to start the worker processes before
it imports the trainers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_algos._lazy import lazy_exports

if TYPE_CHECKING:
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

_WHERE = {
    "ActorGroup": ".groups",
    "CriticGroup": ".groups",
    "DPOTrainer": ".dpo",
    "PPOTrainer": ".ppo",
    "ReferenceGroup": ".groups",
    "RestartsExhaustedError": ".base",
    "RewardModelGroup": ".groups",
    "RewardScorer": ".groups",
    "RoleGroups": ".roles",
    "RolloutGroup": ".groups",
    "SFTTrainer": ".sft",
    "SyncActorWorker": ".roles",
    "Trainer": ".base",
    "build_role_groups": ".roles",
}

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

__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
