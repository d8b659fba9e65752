"""ppo_actor_loss against TRL GRPOTrainer's loss formulas, value and gradient.

The formulas are TRL 1.16's ``GRPOTrainer._compute_loss`` (``beta=0``, two-sided clip),
written out here so CI pins the mapping without TRL's venv:
``token-mean`` = ``bnpo``/``dapo``, ``seq-mean-token-mean`` = ``grpo``,
``seq-mean-token-sum-norm`` (norm = max completion length) = ``dr_grpo``, and ``gspo`` +
``seq-mean-token-mean`` = ``grpo`` with ``importance_sampling_level="sequence"``. The loss
runs as an engine runs it: two micro-batches, each returning its share of the mini-batch
under the global token / sequence totals. ``tools/bench/grpo_step_check.py`` checks the
same pairs against TRL itself, through a real model and optimizer step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch

from hf_algos.losses import ppo_actor_loss
from hf_protocol import DataProto, fields

B, T, CLIP = 6, 5, 0.2


def trl_loss(
    loss_type: str, log_prob: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """TRL's per-token loss and aggregation; ``adv`` ``(B,)``, the rest ``(B, T)``."""
    level, loss_type = ("sequence", "grpo") if loss_type == "gspo" else ("token", loss_type)
    log_ratio = log_prob - old
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - CLIP, 1 + CLIP)
    advantages = adv.unsqueeze(1)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    assert loss_type == "dr_grpo"
    return (per_token_loss * mask).sum() / (per_token_loss.size(0) * T)


def engine_style_loss(
    loss_fn: Callable[..., tuple[torch.Tensor, dict[str, float]]],
    log_prob: torch.Tensor,
    tensors: dict[str, torch.Tensor],
) -> torch.Tensor:
    """Sum of the shares of two micro-batches (rows 0-2, 3-5) under mini-batch totals."""
    mask = tensors[fields.RESPONSE_MASK]
    totals = {"tokens": float(mask.sum()), "sequences": float((mask.sum(-1) > 0).sum())}
    total = torch.zeros(())
    for rows in (slice(0, 3), slice(3, 6)):
        micro = DataProto.from_dict(
            tensors={k: v[rows] for k, v in tensors.items()},
            meta_info={fields.MINI_BATCH_TOTALS: totals},
        )
        share, _ = loss_fn({"log_probs": log_prob[rows]}, micro)
        total = total + share
    return total


@pytest.mark.parametrize(
    ("mode", "policy_loss", "trl_type"),
    [
        ("token-mean", "ppo", "bnpo"),
        ("seq-mean-token-mean", "ppo", "grpo"),
        ("seq-mean-token-sum-norm", "ppo", "dr_grpo"),
        ("seq-mean-token-mean", "gspo", "gspo"),
    ],
)
def test_actor_loss_equals_trl_grpo_loss(mode: str, policy_loss: str, trl_type: str) -> None:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([1, 5, 3, 2, 4, 5])
    mask = (torch.arange(T) < lengths.unsqueeze(1)).float()
    new = -torch.rand(B, T, generator=generator) * 3
    # Old log-probs off by up to 0.3: some ratios leave [0.8, 1.2] and are clipped.
    old = (new + (torch.rand(B, T, generator=generator) - 0.5) * 0.6) * mask
    adv = torch.randn(B, generator=generator)
    tensors = {
        fields.RESPONSE_MASK: mask,
        fields.OLD_LOG_PROBS: old,
        fields.ADVANTAGES: adv.unsqueeze(1) * mask,
    }
    loss_fn = functools.partial(
        ppo_actor_loss,
        clip_low=CLIP,
        clip_high=CLIP,
        loss_agg_mode=mode,
        policy_loss=policy_loss,
    )
    ours_in = new.clone().requires_grad_(True)
    ours = engine_style_loss(loss_fn, ours_in, tensors)
    theirs_in = new.clone().requires_grad_(True)
    theirs = trl_loss(trl_type, theirs_in, old, adv, mask)
    ours.backward()
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    assert ours_in.grad is not None and theirs_in.grad is not None
    torch.testing.assert_close(ours_in.grad, theirs_in.grad, rtol=1e-5, atol=1e-7)
    clipped = ((old - new).abs() * mask).max()
    assert clipped > 0.2  # the clip is exercised (|log-ratio| > log 1.2)
