"""Advantage estimators: pure functions from rewards (and values / groups) to advantages.

Shapes: ``token_level_rewards``, ``values``, ``response_mask`` are ``(B, R)``; ``index`` is
one group label per row (``B`` labels, the prompt's ``uid``: rows sharing it answer the
same prompt); ``reward_baselines`` is ``(B,)``. Each returns ``(advantages, returns)``, both
``(B, R)`` and zero at padding. Outcome-reward estimators use the sequence score
``sum_t token_level_rewards``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

from hf_algos.advantages.grouping import group_ids, group_mean_std
from hf_algos.masked import masked_whiten

GroupIndex = Sequence[Hashable] | np.ndarray[Any, Any] | torch.Tensor
"""One group label per row (e.g. the ``uid`` column)."""


@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016) for PPO with a critic.

    ``delta_t = r_t + gamma * V_{t+1} - V_t``, ``A_t = delta_t + gamma * lam * A_{t+1}``,
    ``returns = A + V``; the value after the last valid token is 0. Masked positions inside a
    response (e.g. tool output in multi-turn) are skipped: the recursion carries across them.
    With ``whiten`` the advantages are whitened over the batch's valid tokens.
    """
    mask = response_mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        next_value = mask[:, t] * values[:, t] + (1 - mask[:, t]) * next_value
        next_advantage = mask[:, t] * advantage + (1 - mask[:, t]) * next_advantage
        advantages[:, t] = next_advantage
    returns = (advantages + values) * mask
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages * mask, returns


@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    *,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: each sequence's score minus its group's mean, divided by the group's std.

    ``A_i = (s_i - mean_g) / (std_g + epsilon)`` (unbiased std), broadcast over the valid
    tokens. ``norm_adv_by_std=False`` gives Dr. GRPO's ``A_i = s_i - mean_g``, which does
    not up-weight groups with little reward spread. A group of one keeps its raw score.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, std, _ = group_mean_std(scores, group_ids(index))
    advantage = scores - mean
    if norm_adv_by_std:
        advantage = advantage / (std + epsilon)
    advantages = advantage.unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: each sequence's score minus the mean score of the *other* samples of its group.

    ``A_i = s_i - (sum_g - s_i) / (n - 1) = n / (n - 1) * (s_i - mean_g)``
    (Ahmadian et al., 2024). A group of one has no baseline and keeps its raw score.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, _, sizes = group_mean_std(scores, group_ids(index))
    scale = torch.where(sizes > 1, sizes / (sizes - 1).clamp(min=1.0), torch.ones_like(sizes))
    advantage = (scores - mean) * scale
    advantages = advantage.unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@torch.no_grad()
def compute_reinforce_plus_plus_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go per token, whitened over the batch.

    ``G_t = r_t + gamma * G_{t+1}`` over the valid tokens (Hu, 2025); advantages are ``G``
    whitened over the batch's valid tokens, returns are ``G``.
    """
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        # Padding must not leak into the tokens before it.
        running = running * mask[:, t]
    returns = returns * mask
    return masked_whiten(returns, mask) * mask, returns


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    *,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline: ``s_i - mean_g``, then whitened over the batch.

    The group mean removes per-prompt difficulty; the batch-level whitening (instead of
    GRPO's per-group std) keeps the scale stable. ``epsilon`` guards the whitening.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, _, _ = group_mean_std(scores, group_ids(index))
    mask = response_mask.to(scores.dtype)
    centred = (scores - mean).unsqueeze(-1) * mask
    advantages = masked_whiten(centred, mask, eps=epsilon) * mask
    return advantages, advantages


@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    reward_baselines: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: return-to-go minus the score of the greedy response to the same prompt.

    ``returns_t = sum_{k>=t} r_k``; ``A_t = returns_t - b`` where ``b`` (``reward_baselines``,
    ``(B,)``) is the reward of a greedy decode (Li et al., 2023).
    """
    mask = response_mask.to(token_level_rewards.dtype)
    masked = token_level_rewards * mask
    returns = masked.flip(-1).cumsum(-1).flip(-1) * mask
    advantages = (returns - reward_baselines.to(returns.dtype).unsqueeze(-1)) * mask
    return advantages, returns
