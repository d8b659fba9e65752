"""Batched sampling: top-k / top-p filters, drawing, and the returned log-probs."""

from __future__ import annotations

import torch

from hf_rollout.config import SamplingConfig
from hf_rollout.sampling import draw_from_probs, filter_top_k, filter_top_p, sample_next_tokens


def test_top_k_keeps_the_k_largest() -> None:
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    kept = torch.isfinite(filter_top_k(logits, 2))
    assert kept.tolist() == [[False, True, True, False]]
    assert torch.equal(filter_top_k(logits, -1), logits)


def test_top_p_keeps_the_smallest_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.9, 0.03, 0.02]])
    kept = torch.isfinite(filter_top_p(probs.log(), 0.8))
    assert kept.tolist() == [[True, True, False, False], [False, True, False, False]]


def test_draws_follow_the_probabilities() -> None:
    probs = torch.tensor([[0.7, 0.0, 0.2, 0.1]]).expand(20000, 4)
    draws = draw_from_probs(probs, torch.rand(20000, generator=torch.Generator().manual_seed(0)))
    frequencies = torch.bincount(draws, minlength=4).float() / len(draws)
    assert frequencies[1] == 0  # zero probability is never drawn
    assert torch.allclose(frequencies, probs[0], atol=0.015)


def test_log_probs_are_taken_at_the_temperature() -> None:
    logits = torch.randn(6, 10, generator=torch.Generator().manual_seed(0))
    sampling = SamplingConfig(temperature=0.5, top_k=3)
    uniform = torch.rand(6, generator=torch.Generator().manual_seed(1))
    tokens, log_probs = sample_next_tokens(logits, sampling, uniform)
    expected = torch.log_softmax(logits / 0.5, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(log_probs, expected)
    top3 = logits.topk(3, dim=-1).indices
    assert (top3 == tokens[:, None]).any(dim=-1).all()


def test_greedy_takes_the_argmax() -> None:
    logits = torch.randn(5, 10, generator=torch.Generator().manual_seed(0))
    tokens, _ = sample_next_tokens(logits, SamplingConfig(greedy=True, temperature=0.1), None)
    assert torch.equal(tokens, logits.argmax(dim=-1))
