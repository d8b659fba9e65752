"""Advantage estimators against hand-computed cases, the registry and the DataProto glue."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from hf_algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_advantage,
    compute_reinforce_plus_plus_baseline_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    register_advantage_estimator,
)
from hf_protocol import DataProto


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def close(actual: torch.Tensor, expected: list[list[float]] | list[float]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ GAE


def test_gae_gamma_lambda_one_is_return_minus_value() -> None:
    adv, ret = compute_gae_advantage_return(
        t([[0, 0, 1]]), t([[0.5, 0.5, 0.5]]), t([[1, 1, 1]]), gamma=1.0, lam=1.0, whiten=False
    )
    close(adv, [[0.5, 0.5, 0.5]])
    close(ret, [[1.0, 1.0, 1.0]])


def test_gae_discounted_by_hand() -> None:
    # t=2: delta=1-0.5=0.5, A=0.5; t=1: delta=0.5*0.5-0.5=-0.25, A=-0.25+0.25*0.5=-0.125;
    # t=0: delta=-0.25, A=-0.25+0.25*(-0.125)=-0.28125; returns = A + V.
    adv, ret = compute_gae_advantage_return(
        t([[0, 0, 1]]), t([[0.5, 0.5, 0.5]]), t([[1, 1, 1]]), gamma=0.5, lam=0.5, whiten=False
    )
    close(adv, [[-0.28125, -0.125, 0.5]])
    close(ret, [[0.21875, 0.375, 1.0]])


def test_gae_ignores_padding_and_skips_holes() -> None:
    # Right padding: the value 9 at the padded position must not be bootstrapped from.
    adv, ret = compute_gae_advantage_return(
        t([[0, 1, 0]]), t([[0.5, 0.5, 9.0]]), t([[1, 1, 0]]), whiten=False
    )
    close(adv, [[0.5, 0.5, 0.0]])
    close(ret, [[1.0, 1.0, 0.0]])
    # A hole (e.g. tool output) is skipped: same as the two-token sequence without it.
    adv, _ = compute_gae_advantage_return(
        t([[0, 0, 1]]), t([[0.5, 7.0, 0.5]]), t([[1, 0, 1]]), whiten=False
    )
    close(adv, [[0.5, 0.0, 0.5]])


def test_gae_whitening_over_valid_tokens() -> None:
    mask = t([[1, 1, 1], [1, 1, 0]])
    raw, _ = compute_gae_advantage_return(
        t([[0, 0, 1], [0, 2, 0]]), t([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]), mask, whiten=False
    )
    white, _ = compute_gae_advantage_return(
        t([[0, 0, 1], [0, 2, 0]]), t([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]), mask, whiten=True
    )
    valid = raw[mask.bool()].tolist()
    mean, std = statistics.mean(valid), statistics.stdev(valid)
    expected = [(v - mean) / std for v in valid]
    close(white[mask.bool()], expected)
    assert white[1, 2] == 0.0


# ------------------------------------------------------------------------------ outcome


REWARDS = t([[0, 1], [0, 0], [1, 0], [0, 0.5]])  # scores 1, 0, 1, 0.5
MASK = t([[1, 1], [1, 1], [1, 0], [1, 1]])
UIDS = np.array(["a", "a", "a", "b"], dtype=object)


def test_grpo_std_normalised_and_dr_grpo() -> None:
    adv, ret = compute_grpo_outcome_advantage(REWARDS, MASK, UIDS, epsilon=0.0)
    # group a: mean 2/3, unbiased std sqrt(1/3); group b alone keeps its score 0.5.
    std = math.sqrt(1 / 3)
    up, down = (1 / 3) / std, (-2 / 3) / std
    close(adv, [[up, up], [down, down], [up, 0.0], [0.5, 0.5]])
    assert torch.equal(adv, ret)
    adv, _ = compute_grpo_outcome_advantage(REWARDS, MASK, UIDS, norm_adv_by_std=False)
    close(adv, [[1 / 3, 1 / 3], [-2 / 3, -2 / 3], [1 / 3, 0.0], [0.5, 0.5]])


def test_grpo_equal_scores_give_zero_not_nan() -> None:
    adv, _ = compute_grpo_outcome_advantage(t([[1.0], [1.0]]), t([[1], [1]]), ["x", "x"])
    close(adv, [[0.0], [0.0]])


def test_rloo_leave_one_out_baseline() -> None:
    adv, _ = compute_rloo_outcome_advantage(REWARDS, MASK, UIDS)
    # 1 - mean(0, 1) = 0.5 ; 0 - mean(1, 1) = -1 ; group b has no baseline.
    close(adv, [[0.5, 0.5], [-1.0, -1.0], [0.5, 0.0], [0.5, 0.5]])


def test_reinforce_plus_plus_discounted_returns_whitened() -> None:
    rewards = t([[0, 0, 1], [2, 0, 0]])
    mask = t([[1, 1, 1], [1, 0, 0]])
    adv, ret = compute_reinforce_plus_plus_advantage(rewards, mask, gamma=0.5)
    close(ret, [[0.25, 0.5, 1.0], [2.0, 0.0, 0.0]])
    valid = [0.25, 0.5, 1.0, 2.0]
    mean, std = statistics.mean(valid), statistics.stdev(valid)
    close(adv[mask.bool()], [(v - mean) / std for v in valid])
    assert adv[1, 1:].abs().sum() == 0.0


def test_reinforce_plus_plus_baseline_group_mean_then_batch_whitening() -> None:
    rewards = t([[1.0], [0.0], [3.0], [3.0]])
    adv, ret = compute_reinforce_plus_plus_baseline_advantage(
        rewards, t([[1], [1], [1], [1]]), [0, 0, 1, 1], epsilon=0.0
    )
    # centred: 0.5, -0.5, 0, 0; unbiased std over the batch = sqrt(0.5 / 3).
    std = math.sqrt(0.5 / 3)
    close(adv, [[0.5 / std], [-0.5 / std], [0.0], [0.0]])
    assert torch.equal(adv, ret)


def test_remax_return_minus_greedy_baseline() -> None:
    adv, ret = compute_remax_outcome_advantage(
        t([[0, 0, 1], [0, 1, 0]]), t([[1, 1, 1], [1, 1, 0]]), torch.tensor([0.4, 1.5])
    )
    close(ret, [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    close(adv, [[0.6, 0.6, 0.6], [-0.5, -0.5, 0.0]])


# ------------------------------------------------------------------------------ registry / glue


def test_registry_holds_the_issue_estimators() -> None:
    assert set(ADVANTAGE_ESTIMATORS) >= {
        "gae",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
    }
    assert ADVANTAGE_ESTIMATORS["gae"].inputs == ("token_level_rewards", "values", "response_mask")
    assert ADVANTAGE_ESTIMATORS["grpo"].hyperparameters == {
        "norm_adv_by_std": True,
        "epsilon": 1e-6,
    }
    with pytest.raises(ValueError, match="already registered"):
        register_advantage_estimator("grpo", compute_grpo_outcome_advantage)


@pytest.mark.parametrize(
    ("name", "critic", "greedy", "group"),
    [
        ("gae", True, False, 1),
        ("grpo", False, False, 2),
        ("rloo", False, False, 2),
        ("reinforce_plus_plus", False, False, 1),
        ("reinforce_plus_plus_baseline", False, False, 2),
        ("remax", False, True, 1),
    ],
)
def test_what_an_estimator_needs_follows_from_its_inputs(
    name: str, critic: bool, greedy: bool, group: int
) -> None:
    entry = ADVANTAGE_ESTIMATORS[name]
    assert (entry.needs_critic, entry.needs_greedy_baseline) == (critic, greedy)
    assert entry.min_group_size == group


def batch() -> DataProto:
    return DataProto.from_dict(
        tensors={"token_level_rewards": REWARDS.clone(), "response_mask": MASK.clone()},
        non_tensors={"uid": UIDS},
    )


def test_compute_advantage_on_dataproto_writes_fields() -> None:
    data = compute_advantage(batch(), "rloo")
    assert data.batch is not None
    close(data.batch["advantages"], [[0.5, 0.5], [-1.0, -1.0], [0.5, 0.0], [0.5, 0.5]])
    close(data.batch["returns"], data.batch["advantages"].tolist())
    data = compute_advantage(batch(), "grpo", norm_adv_by_std=False)
    assert data.batch is not None
    close(data.batch["advantages"][:, 0], [1 / 3, -2 / 3, 1 / 3, 0.5])


def test_compute_advantage_takes_an_entry_and_matches_the_function() -> None:
    gae = ADVANTAGE_ESTIMATORS["gae"]
    tensors = {
        "token_level_rewards": t([[0, 0, 1]]),
        "values": t([[0.5, 0.5, 0.5]]),
        "response_mask": t([[1, 1, 1]]),
    }
    adv, ret = gae.fn(**tensors, gamma=0.5, lam=0.5, whiten=False)
    close(adv, [[-0.28125, -0.125, 0.5]])
    close(ret, [[0.21875, 0.375, 1.0]])
    data = compute_advantage(DataProto.from_dict(tensors), gae, gamma=0.5, lam=0.5, whiten=False)
    assert data.batch is not None
    close(data.batch["advantages"], adv.tolist())
    close(data.batch["returns"], ret.tolist())


def test_compute_advantage_errors_name_the_fix() -> None:
    with pytest.raises(TypeError, match=r"takes a DataProto first.*\.fn\("):
        compute_advantage(REWARDS, "grpo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'.*grpo"):
        compute_advantage(batch(), "ppo")
    with pytest.raises(TypeError, match=r"takes no \['lam'\]"):
        compute_advantage(batch(), "grpo", lam=0.9)
    with pytest.raises(KeyError, match="needs batch field 'values'"):
        compute_advantage(batch(), "gae")
    no_uid = DataProto.from_dict(tensors={"token_level_rewards": REWARDS, "response_mask": MASK})
    with pytest.raises(KeyError, match="uid"):
        compute_advantage(no_uid, "grpo")
