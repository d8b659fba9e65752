"""Loss aggregation modes and masked reductions against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from hf_algos.losses import LOSS_AGG_MODES, aggregate_loss, global_share
from hf_algos.masked import masked_mean, masked_var, masked_whiten

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 7.0, 7.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # the third row has no tokens


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 4) / 3),
        ("seq-mean-token-sum", (3 + 4) / 2),
        ("seq-mean-token-mean", (1.5 + 4) / 2),
        ("seq-mean-token-sum-norm", (3 / 3 + 4 / 3) / 2),
    ],
)
def test_modes_by_hand(mode: str, expected: float) -> None:
    assert aggregate_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_sum_norm_uses_the_given_constant() -> None:
    value = aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=2)
    assert value.item() == pytest.approx((3 / 2 + 4 / 2) / 2)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_empty_mask_gives_zero_and_finite_gradient(mode: str) -> None:
    loss = LOSS.clone().requires_grad_(True)
    value = aggregate_loss(loss, torch.zeros_like(MASK), mode)
    value.backward()
    assert value.item() == 0.0
    assert loss.grad is not None and torch.isfinite(loss.grad).all()


def test_seq_mean_token_mean_gradient_weighs_rows_equally() -> None:
    loss = LOSS.clone().requires_grad_(True)
    aggregate_loss(loss, MASK, "seq-mean-token-mean").backward()
    assert loss.grad is not None
    # seq-mean-token-mean: row 0's two tokens get 1/2 * 1/2, row 1's single token 1/2.
    torch.testing.assert_close(loss.grad, torch.tensor([[0.25, 0.25, 0], [0.5, 0, 0], [0, 0, 0]]))


def test_errors_name_the_choices() -> None:
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match="shape"):
        aggregate_loss(LOSS, MASK[:, :2], "token-mean")


def test_masked_statistics_by_hand() -> None:
    values = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert masked_mean(values, mask).item() == 2.0
    assert masked_var(values, mask).item() == 2.0  # ((1-2)^2 + (3-2)^2) / (2 - 1)
    assert masked_var(values, mask, unbiased=False).item() == 1.0
    white = masked_whiten(values, mask, eps=0.0)
    torch.testing.assert_close(white[0, :2], torch.tensor([-(2**-0.5), 2**-0.5]))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_global_shares_of_any_split_add_up_to_the_whole(mode: str) -> None:
    # Rows 0-1 / 2 as two micro-batches (the second has no tokens), then 0 / 1-2.
    loss, mask = LOSS.clone(), MASK
    totals = {"tokens": float(mask.sum()), "sequences": float((mask.sum(-1) > 0).sum())}
    whole = aggregate_loss(loss, mask, mode)
    for cut in (1, 2):
        parts = [(loss[:cut], mask[:cut]), (loss[cut:], mask[cut:])]
        shares = [global_share(aggregate_loss(lm, m, mode), m, mode, totals) for lm, m in parts]
        torch.testing.assert_close(sum(shares), whole)
    # Outside an engine (no totals) a loss is the micro-batch's own aggregate.
    assert global_share(whole, mask, mode, None) is whole


def test_global_share_of_a_token_less_micro_batch_is_zero_with_zero_gradient() -> None:
    loss = torch.ones(1, 3, requires_grad=True)
    empty = torch.zeros(1, 3)
    share = global_share(
        aggregate_loss(loss, empty, "seq-mean-token-mean"),
        empty,
        "seq-mean-token-mean",
        {"tokens": 3.0, "sequences": 2.0},
    )
    share.backward()
    assert float(share.detach()) == 0.0 and loss.grad is not None and not loss.grad.any()
    with pytest.raises(ValueError, match="count nothing to average over"):
        global_share(share, empty, "token-mean", {"tokens": 0.0, "sequences": 0.0})
