"""hf-algos: RL algorithm math (advantages, losses, KL, DPO), rewards and data for HybridFlow."""

from hf_algos.advantages import ADVANTAGE_ESTIMATORS, compute_advantage
from hf_algos.data import (
    PreferenceDataset,
    RLDataset,
    StatefulDataLoader,
    build_preference_pairs,
    collate_to_dataproto,
    make_preference_batch,
)
from hf_algos.kl import AdaptiveKLController, FixedKLController, apply_kl_penalty, kl_penalty
from hf_algos.losses import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    aggregate_loss,
    critic_loss,
    dpo_loss,
    dpo_loss_fn,
    ppo_actor_loss,
)
from hf_algos.rewards import SCORING_FUNCTIONS, RewardManager, RewardModelScorer

__version__ = "0.1.0"

__all__: list[str] = [
    "ADVANTAGE_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "SCORING_FUNCTIONS",
    "AdaptiveKLController",
    "FixedKLController",
    "PreferenceDataset",
    "RLDataset",
    "RewardManager",
    "RewardModelScorer",
    "StatefulDataLoader",
    "aggregate_loss",
    "apply_kl_penalty",
    "build_preference_pairs",
    "collate_to_dataproto",
    "compute_advantage",
    "critic_loss",
    "dpo_loss",
    "dpo_loss_fn",
    "kl_penalty",
    "make_preference_batch",
    "ppo_actor_loss",
]
