"""Validation metrics: greedy accuracy per data source, sampled mean@k, pass@k and maj@k."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_algos.trainers.ppo.evaluation import (
    majority_vote_accuracy,
    sampled_validation_metrics,
    validation_metrics,
    vote_keys,
)
from hf_protocol import DataProto, fields


def test_sampled_metrics_are_mean_and_pass_at_k() -> None:
    # 3 prompts x 4 answers, each prompt's answers together (the rollout's order)
    scores = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0.5])
    metrics = sampled_validation_metrics(scores, samples=4)
    assert metrics["val/sampled/accuracy"] == pytest.approx(4 / 12)
    assert metrics["val/sampled/pass@4"] == pytest.approx(2 / 3)
    assert metrics["val/sampled/score/mean"] == pytest.approx(float(scores.mean()))


def test_greedy_metrics_per_source() -> None:
    metrics = validation_metrics(torch.tensor([1.0, 0.0, 1.0]), np.array(["a", "a", "b"]))
    assert metrics["val/accuracy"] == pytest.approx(2 / 3)
    assert metrics["val/a/score/mean"] == 0.5 and metrics["val/b/score/mean"] == 1.0


def test_majority_vote_takes_each_prompts_most_frequent_answer() -> None:
    # prompt 1: "7" twice (right) beats "8"; prompt 2: "3" twice (wrong) beats the right "4";
    # prompt 3: a tie of "5" (first, right) and "6": the first given wins
    answers = ["7", "8", "7", "4", "3", "3", "5", "6"]
    scores = torch.tensor([1.0, 0, 1, 1, 0, 0, 1, 0])
    metrics = sampled_validation_metrics(scores.view(-1)[:6], samples=3, answers=answers[:6])
    assert metrics["val/sampled/maj@3"] == pytest.approx(1 / 2)
    assert majority_vote_accuracy(scores[6:], answers[6:], samples=2) == 1.0
    with pytest.raises(ValueError, match="prompts x samples=3"):
        majority_vote_accuracy(scores[:4], answers[:4], samples=3)


def test_vote_keys_prefer_the_reward_functions_pred() -> None:
    responses = torch.tensor([[5, 6, 0], [7, 0, 0]])
    output = DataProto.from_dict(
        {fields.RESPONSES: responses, fields.RESPONSE_MASK: (responses > 0).long()}
    )
    scored = DataProto.from_dict(
        {"placeholder": torch.zeros(2)},
        non_tensors={fields.REWARD_EXTRA_INFO: np.array([{"pred": 42}, {"score": 0.0}])},
    )
    keys = vote_keys(output, scored, lambda ids: f" {'-'.join(map(str, ids))} ")
    assert keys == ["42", "7"]
