"""Batched next-token sampling as pure tensor functions (no per-row Python loops).

Shapes: ``B`` rows, ``V`` vocabulary.
"""

from __future__ import annotations

import torch

from hf_rollout.config import SamplingConfig


def filter_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Logits with everything below the ``top_k``-th largest of each row set to ``-inf``.

    Shape: ``(B, V)`` -> ``(B, V)``. ``top_k <= 0`` or ``>= V`` leaves the logits as they are.
    """
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    threshold = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < threshold, float("-inf"))


def filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits outside each row's nucleus set to ``-inf``.

    The nucleus is the smallest set of most likely tokens whose probability reaches
    ``top_p``; the most likely token is always kept. Shape: ``(B, V)`` -> ``(B, V)``.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def draw_from_probs(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One index per row drawn with the row's probabilities (inverse CDF, batched).

    ``uniform`` holds one draw from ``[0, 1)`` per row, so the caller decides where the
    randomness comes from (a row keeps its random stream when other rows leave the batch).
    Shape: ``(B, V)``, ``(B,)`` -> ``(B,)`` long. Zero-probability entries are never drawn;
    rows need not be exactly normalised. Much cheaper on CPU than ``torch.multinomial``.
    """
    cdf = probs.cumsum(dim=-1)
    picks = torch.searchsorted(cdf, uniform[:, None] * cdf[:, -1:], right=True)
    return picks.squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def sample_next_tokens(
    logits: torch.Tensor, sampling: SamplingConfig, uniform: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row (``uniform``: one ``[0, 1)`` draw per row) and its log-prob.

    The log-prob is that of the token under the temperature-scaled model distribution,
    ``log_softmax(logits / T)`` (``T = 1`` when greedy), before top-k / top-p truncation:
    exactly what a training engine computes at that temperature. Shape:
    ``(B, V)``, ``(B,)`` -> ``(B,)`` long tokens and ``(B,)`` float32 log-probs.
    """
    scaled = logits.float()
    if not sampling.is_greedy and sampling.temperature != 1.0:
        scaled = scaled / sampling.temperature
    log_probs = torch.log_softmax(scaled, dim=-1)
    if sampling.is_greedy:
        tokens = scaled.argmax(dim=-1)
    else:
        if uniform is None:
            raise ValueError("sampling (not greedy) needs one uniform draw per row")
        filtered = filter_top_p(filter_top_k(scaled, sampling.top_k), sampling.top_p)
        probs = torch.softmax(filtered, dim=-1)
        tokens = draw_from_probs(probs, uniform)
    return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
