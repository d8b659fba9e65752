"""Clipped value loss and the entropy bonus against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from hf_algos.losses import clipped_value_loss, entropy_bonus

OLD = torch.tensor([[0.5, 0.5, 0.0]])
RETURNS = torch.tensor([[1.5, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 0]])


def test_clipped_value_loss_by_hand() -> None:
    vpreds = torch.tensor([[1.0, 2.0, 5.0]], requires_grad=True)
    out = clipped_value_loss(vpreds, OLD, RETURNS, MASK, cliprange_value=0.2)
    # token 1: max((1-1.5)^2, (0.7-1.5)^2) = 0.64; token 2: max((2-0)^2, (0.7-0)^2) = 4.
    assert out.loss.item() == pytest.approx(0.5 * (0.64 + 4.0) / 2)
    assert out.clipfrac.item() == pytest.approx(0.5)
    out.loss.backward()
    # The clipped term of token 1 is constant in vpreds; token 2: 0.5 * 2 * (2 - 0) / 2.
    assert vpreds.grad is not None
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, 1.0, 0.0]]))


def test_unclipped_value_loss() -> None:
    out = clipped_value_loss(
        torch.tensor([[1.0, 2.0, 5.0]]), OLD, RETURNS, MASK, cliprange_value=None
    )
    assert out.loss.item() == pytest.approx(0.5 * (0.25 + 4.0) / 2)
    assert out.clipfrac.item() == 0.0


def test_entropy_bonus_aggregates_like_the_loss() -> None:
    entropy = torch.tensor([[1.0, 3.0, 9.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert entropy_bonus(entropy, mask).item() == pytest.approx(2.0)
    assert entropy_bonus(entropy, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)
