"""Log-probabilities and entropy of response tokens, as pure tensor functions.

Shapes use ``B`` rows, ``T`` positions of the whole sequence (prompt + response), ``R``
response positions and ``V`` vocabulary entries.
"""

from __future__ import annotations

import torch


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of each label under the categorical distribution given by ``logits``.

    Shape: logits ``(..., V)``, labels ``(...)`` (int64) -> ``(...)`` in float32.
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return torch.gather(log_probs, -1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution given by ``logits``.

    Shape: ``(..., V)`` -> ``(...)`` in float32.
    """
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def response_positions(sequence: torch.Tensor, response_length: int) -> torch.Tensor:
    """The positions whose outputs predict the response tokens.

    With responses right after the (left-padded) prompt, token ``t`` of the response is
    predicted at position ``T - R - 1 + t``.

    Shape: ``(B, T, ...)`` -> ``(B, R, ...)``.
    """
    if response_length < 1 or response_length >= sequence.shape[1]:
        raise ValueError(
            f"response_length={response_length} must be in [1, {sequence.shape[1] - 1}] for "
            f"sequences of length {sequence.shape[1]}"
        )
    return sequence[:, -response_length - 1 : -1]


def response_log_probs(
    logits: torch.Tensor, responses: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy of the response tokens at ``temperature``.

    ``logits`` are the model's outputs for the ``R`` positions that predict the response
    (see :func:`response_positions`); they are divided by ``temperature`` first, as the
    sampler did.

    Shape: logits ``(B, R, V)``, responses ``(B, R)`` -> ``((B, R), (B, R))`` float32.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature!r} must be > 0")
    if logits.shape[:2] != responses.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not line up with responses {tuple(responses.shape)}"
        )
    scaled = logits.float() / temperature
    return logprobs_from_logits(scaled, responses), entropy_from_logits(scaled)
