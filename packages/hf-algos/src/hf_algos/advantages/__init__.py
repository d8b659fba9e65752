"""Advantage estimators (pure tensor functions), their registry, and the DataProto glue."""

from hf_algos.advantages.compute import compute_advantage
from hf_algos.advantages.estimators import (
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_advantage,
    compute_reinforce_plus_plus_baseline_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from hf_algos.advantages.registry import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    get_advantage_estimator,
    register_advantage_estimator,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "compute_advantage",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_reinforce_plus_plus_advantage",
    "compute_reinforce_plus_plus_baseline_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "get_advantage_estimator",
    "register_advantage_estimator",
]
