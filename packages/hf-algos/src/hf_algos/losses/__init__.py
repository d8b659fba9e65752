"""Losses: aggregation modes, policy / critic (value) / DPO / SFT losses, entropy, rollout
correction, engine loss functions."""

from hf_algos.losses.actor_loss import ppo_actor_loss
from hf_algos.losses.aggregation import (
    LOSS_AGG_MODES,
    aggregate_loss,
    check_loss_agg_mode,
    global_share,
)
from hf_algos.losses.critic import ValueLossOutput, clipped_value_loss, critic_loss
from hf_algos.losses.dpo import DPO_LOSSES, DPOLossOutput, dpo_loss, dpo_loss_fn
from hf_algos.losses.entropy import entropy_bonus
from hf_algos.losses.policy import (
    POLICY_LOSSES,
    PolicyLossOutput,
    get_policy_loss,
    gspo_policy_loss,
    ppo_policy_loss,
    register_policy_loss,
    reinforce_policy_loss,
)
from hf_algos.losses.rollout_correction import (
    CORRECTION_LEVELS,
    CORRECTION_MODES,
    RolloutCorrection,
    compute_rollout_correction,
    masked_is_weights,
    mismatch_kl,
    rollout_log_ratio,
    truncated_is_weights,
)
from hf_algos.losses.sft import sft_loss

__all__ = [
    "CORRECTION_LEVELS",
    "CORRECTION_MODES",
    "DPO_LOSSES",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "DPOLossOutput",
    "PolicyLossOutput",
    "RolloutCorrection",
    "ValueLossOutput",
    "aggregate_loss",
    "check_loss_agg_mode",
    "clipped_value_loss",
    "compute_rollout_correction",
    "critic_loss",
    "dpo_loss",
    "dpo_loss_fn",
    "entropy_bonus",
    "get_policy_loss",
    "global_share",
    "gspo_policy_loss",
    "masked_is_weights",
    "mismatch_kl",
    "ppo_actor_loss",
    "ppo_policy_loss",
    "register_policy_loss",
    "reinforce_policy_loss",
    "rollout_log_ratio",
    "sft_loss",
    "truncated_is_weights",
]
