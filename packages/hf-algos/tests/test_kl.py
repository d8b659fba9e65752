"""KL estimators, KL controllers and the reward penalty, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from hf_algos.kl import (
    TOKEN_LEVEL_KL_PENALTY,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
    penalized_rewards,
)
from hf_protocol import DataProto

LN2 = math.log(2.0)
LOG_PROB = torch.tensor([[math.log(0.5), math.log(0.25)]])
REF = torch.tensor([[math.log(0.25), math.log(0.5)]])  # log-ratio +ln2, -ln2


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("kl", [LN2, -LN2]),
        ("abs", [LN2, LN2]),
        ("mse", [0.5 * LN2**2, 0.5 * LN2**2]),
        ("low_var_kl", [0.5 + LN2 - 1.0, 2.0 - LN2 - 1.0]),  # q/p - log(q/p) - 1
    ],
)
def test_estimators_by_hand(kind: str, expected: list[float]) -> None:
    torch.testing.assert_close(kl_penalty(LOG_PROB, REF, kind), torch.tensor([expected]))


def test_low_var_kl_is_clamped() -> None:
    value = kl_penalty(torch.tensor([[-30.0]]), torch.tensor([[0.0]]), "low_var_kl")
    assert value.item() == 10.0


def test_k1_and_k3_expectations_equal_the_exact_kl() -> None:
    # Under p, E[k1] and E[k3] both equal KL(p || q); k3 without negative terms.
    p, q = torch.tensor([0.7, 0.3]), torch.tensor([0.5, 0.5])
    exact = 0.7 * math.log(0.7 / 0.5) + 0.3 * math.log(0.3 / 0.5)
    for kind in ("kl", "low_var_kl"):
        expectation = (p * kl_penalty(p.log(), q.log(), kind)).sum()
        assert expectation.item() == pytest.approx(exact, rel=1e-5)


def test_unknown_kind_lists_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k9'.*low_var_kl"):
        kl_penalty(LOG_PROB, REF, "k9")


def test_adaptive_controller_by_hand() -> None:
    controller = AdaptiveKLController(kl_coef=0.1, target_kl=0.1, horizon=100)
    controller.update(current_kl=0.15, n_steps=10)  # error 0.5 -> clipped 0.2
    assert controller.value == pytest.approx(0.1 * 1.02)
    controller.update(current_kl=0.09, n_steps=10)  # error -0.1
    assert controller.value == pytest.approx(0.1 * 1.02 * 0.99)
    restored = AdaptiveKLController(0.5, 0.1, 100)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == controller.value
    with pytest.raises(ValueError, match="target_kl > 0"):
        AdaptiveKLController(0.1, 0.0, 100)


def test_fixed_controller_keeps_its_value() -> None:
    controller = FixedKLController(0.05)
    controller.update(current_kl=10.0, n_steps=4)
    assert controller.value == 0.05


def test_apply_kl_penalty_subtracts_beta_kl_on_valid_tokens() -> None:
    data = DataProto.from_dict(
        tensors={
            "token_level_scores": torch.tensor([[0.0, 1.0, 0.0]]),
            "old_log_probs": torch.tensor([[math.log(0.5), math.log(0.5), 3.0]]),
            "ref_log_prob": torch.tensor([[math.log(0.25), math.log(0.5), 0.0]]),
            "response_mask": torch.tensor([[1, 1, 0]]),
        }
    )
    controller = AdaptiveKLController(kl_coef=0.1, target_kl=1.0, horizon=10)
    data, metrics = apply_kl_penalty(data, controller, kl_penalty="kl")
    assert data.batch is not None
    torch.testing.assert_close(
        data.batch[TOKEN_LEVEL_KL_PENALTY], torch.tensor([[0.1 * LN2, 0.0, 0.0]])
    )
    torch.testing.assert_close(penalized_rewards(data), torch.tensor([[-0.1 * LN2, 1.0, 0.0]]))
    torch.testing.assert_close(data.batch["token_level_scores"], torch.tensor([[0.0, 1.0, 0.0]]))
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(LN2 / 2)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    assert controller.value == pytest.approx(0.1 * (1 - 0.2 * 1 / 10))  # KL below target


def test_rewards_without_a_penalty_are_the_scores() -> None:
    scores = torch.tensor([[0.0, 0.5]])
    data = DataProto.from_dict(tensors={"token_level_scores": scores})
    torch.testing.assert_close(penalized_rewards(data), scores)


def test_apply_kl_penalty_names_missing_fields() -> None:
    data = DataProto.from_dict(tensors={"token_level_scores": torch.zeros(1, 2)})
    with pytest.raises(KeyError, match="ref_log_prob"):
        apply_kl_penalty(data, FixedKLController(0.1))
