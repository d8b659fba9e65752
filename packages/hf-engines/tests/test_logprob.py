"""Pure log-prob / entropy helpers against direct formulas."""

from __future__ import annotations

import math

import pytest
import torch

from hf_engines import (
    entropy_from_logits,
    logprobs_from_logits,
    response_log_probs,
    response_positions,
)


def test_logprobs_match_softmax() -> None:
    logits = torch.randn(2, 3, 11)
    labels = torch.randint(0, 11, (2, 3))
    expected = torch.softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1).log()
    torch.testing.assert_close(logprobs_from_logits(logits, labels), expected)


def test_entropy_of_uniform_and_one_hot() -> None:
    assert entropy_from_logits(torch.zeros(7)).item() == pytest.approx(math.log(7))
    assert entropy_from_logits(torch.tensor([0.0, 1e4, 0.0])).item() == pytest.approx(0.0)


def test_response_positions_predict_the_response() -> None:
    sequence = torch.arange(10).reshape(1, 10)
    assert response_positions(sequence, 3).tolist() == [[6, 7, 8]]
    with pytest.raises(ValueError, match="response_length=10"):
        response_positions(sequence, 10)


def test_temperature_divides_the_logits() -> None:
    logits = torch.randn(2, 4, 9, dtype=torch.bfloat16)
    responses = torch.randint(0, 9, (2, 4))
    log_probs, entropy = response_log_probs(logits, responses, temperature=0.5)
    assert log_probs.dtype == entropy.dtype == torch.float32
    torch.testing.assert_close(log_probs, logprobs_from_logits(logits.float() * 2, responses))
    torch.testing.assert_close(entropy, entropy_from_logits(logits.float() * 2))
    with pytest.raises(ValueError, match="temperature=0"):
        response_log_probs(logits, responses, temperature=0)
    with pytest.raises(ValueError, match="do not line up"):
        response_log_probs(logits, responses[:, :3])
