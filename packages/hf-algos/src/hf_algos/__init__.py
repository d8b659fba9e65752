"""hf-algos: RL algorithm math (advantages, losses, KL, DPO), rewards and data for HybridFlow.

Public names are imported on first use (``hf_algos._lazy``), so importing one light
submodule does not import torch."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version
from typing import TYPE_CHECKING

from hf_algos._lazy import lazy_exports

if TYPE_CHECKING:
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

try:  # the installed distribution's version, so it cannot drift from pyproject.toml
    __version__ = _distribution_version("hf-algos")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

_WHERE = {
    "ADVANTAGE_ESTIMATORS": "hf_algos.advantages",
    "AdaptiveKLController": "hf_algos.kl",
    "FixedKLController": "hf_algos.kl",
    "LOSS_AGG_MODES": "hf_algos.losses",
    "POLICY_LOSSES": "hf_algos.losses",
    "PreferenceDataset": "hf_algos.data",
    "RLDataset": "hf_algos.data",
    "RewardManager": "hf_algos.rewards",
    "RewardModelScorer": "hf_algos.rewards",
    "SCORING_FUNCTIONS": "hf_algos.rewards",
    "StatefulDataLoader": "hf_algos.data",
    "aggregate_loss": "hf_algos.losses",
    "apply_kl_penalty": "hf_algos.kl",
    "build_preference_pairs": "hf_algos.data",
    "collate_to_dataproto": "hf_algos.data",
    "compute_advantage": "hf_algos.advantages",
    "critic_loss": "hf_algos.losses",
    "dpo_loss": "hf_algos.losses",
    "dpo_loss_fn": "hf_algos.losses",
    "kl_penalty": "hf_algos.kl",
    "make_preference_batch": "hf_algos.data",
    "ppo_actor_loss": "hf_algos.losses",
}

__all__ = [
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
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
