"""PPO (clip-higher, dual-clip), GSPO and REINFORCE losses against hand-computed tokens."""

from __future__ import annotations

import math

import pytest
import torch

from hf_algos.losses import (
    POLICY_LOSSES,
    get_policy_loss,
    gspo_policy_loss,
    ppo_policy_loss,
    register_policy_loss,
    reinforce_policy_loss,
)

# Four tokens: log-ratios +0.5 / -0.5 with advantages +1 / -1 in every combination.
OLD = torch.zeros(1, 4)
LOG_RATIO = torch.tensor([[0.5, -0.5, 0.5, -0.5]])
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
MASK = torch.ones(1, 4)
UP, DOWN = math.exp(0.5), math.exp(-0.5)


def new_log_prob() -> torch.Tensor:
    return (OLD + LOG_RATIO).clone().requires_grad_(True)


def test_ppo_clipped_surrogate_by_hand() -> None:
    log_prob = new_log_prob()
    out = ppo_policy_loss(log_prob, OLD, ADV, MASK, clip_low=0.2, clip_high=0.2)
    # token 1: -min(1.6487, 1.2) = -1.2 (clipped); token 2: -0.6065 (ratio term);
    # token 3: max(1.6487, 1.2) = 1.6487; token 4: max(0.6065, 0.8) = 0.8 (clipped).
    expected = (-1.2 - DOWN + UP + 0.8) / 4
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.clipfrac.item() == pytest.approx(0.5)
    assert out.approx_kl.item() == pytest.approx(0.0, abs=1e-7)
    assert out.clipfrac_lower.item() == 0.0
    out.loss.backward()
    # Clipped tokens carry no gradient; the others d(-A r)/d log_prob = -A r, over 4 tokens.
    assert log_prob.grad is not None
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, -DOWN / 4, UP / 4, 0.0]]))


def test_ppo_clip_higher_uses_the_upper_bound() -> None:
    out = ppo_policy_loss(new_log_prob(), OLD, ADV, MASK, clip_low=0.2, clip_high=0.28)
    assert out.loss.item() == pytest.approx((-1.28 - DOWN + UP + 0.8) / 4, rel=1e-6)


def test_ppo_dual_clip_caps_negative_advantages() -> None:
    out = ppo_policy_loss(new_log_prob(), OLD, ADV, MASK, clip_low=0.2, clip_high=0.2, clip_c=1.5)
    # token 3: min(1.6487, -A * 1.5) = 1.5; the others unchanged.
    assert out.loss.item() == pytest.approx((-1.2 - DOWN + 1.5 + 0.8) / 4, rel=1e-6)
    assert out.clipfrac_lower.item() == pytest.approx(0.25)


def test_ppo_ignores_padding_and_reports_k1_kl() -> None:
    log_prob = torch.tensor([[-1.0, -2.0, -50.0]])
    old = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    out = ppo_policy_loss(log_prob, old, torch.ones(1, 3), mask, clip_low=10.0, clip_high=10.0)
    assert out.loss.item() == pytest.approx(-(math.exp(0.5) + math.exp(-1.0)) / 2, rel=1e-6)
    assert out.approx_kl.item() == pytest.approx((-0.5 + 1.0) / 2)


def test_ppo_rejects_bad_clip_values() -> None:
    with pytest.raises(ValueError, match=r"clip_c=0\.5 must be > 1"):
        ppo_policy_loss(new_log_prob(), OLD, ADV, MASK, clip_c=0.5)
    with pytest.raises(ValueError, match=r"clip_low=-0\.1"):
        ppo_policy_loss(new_log_prob(), OLD, ADV, MASK, clip_low=-0.1)


def test_gspo_sequence_ratio_value_and_gradient() -> None:
    old = torch.zeros(1, 3)
    log_prob = torch.tensor([[0.2, 0.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    out = gspo_policy_loss(log_prob, old, torch.ones(1, 3), mask, clip_low=0.2, clip_high=0.2)
    s = math.exp(0.1)  # exp(mean of the valid log-ratios)
    assert out.loss.item() == pytest.approx(-s, rel=1e-6)
    out.loss.backward()
    # d(-s)/d log_prob_t = -s / |y| for each valid token, as in GSPO.
    assert log_prob.grad is not None
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-s / 2, -s / 2, 0.0]]))
    clipped = gspo_policy_loss(log_prob, old, torch.ones(1, 3), mask, clip_low=0.05, clip_high=0.05)
    assert clipped.loss.item() == pytest.approx(-1.05)
    assert clipped.clipfrac.item() == 1.0


def test_reinforce_is_advantage_weighted_log_likelihood() -> None:
    log_prob = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    out = reinforce_policy_loss(
        log_prob, torch.zeros(1, 2), torch.tensor([[2.0, -1.0]]), MASK[:, :2]
    )
    assert out.loss.item() == pytest.approx((2.0 - 2.0) / 2)
    out.loss.backward()
    assert log_prob.grad is not None
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.0, 0.5]]))


def test_registry() -> None:
    assert {"ppo", "gspo", "reinforce"} <= set(POLICY_LOSSES)
    assert get_policy_loss("gspo") is gspo_policy_loss
    with pytest.raises(ValueError, match="unknown policy loss 'trpo'; choose one of"):
        get_policy_loss("trpo")
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("ppo", ppo_policy_loss)
