"""Validation metrics: greedy accuracy per data source, sampled mean@k and pass@k."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_algos.trainers.steps import sampled_validation_metrics, validation_metrics


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
