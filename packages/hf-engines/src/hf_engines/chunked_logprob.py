"""Log-probs and entropy of given tokens from hidden states, a chunk of tokens at a time.

The full-logits path (``lm_head`` over every scored position, then ``log_softmax``) holds
``(N, V)`` float32 tensors for ``N`` scored tokens: for Gemma 3's 262k vocabulary one
2048-token micro-batch is 2.1 GB per tensor, and autograd keeps the log-softmax for the
backward. Here the output head, the temperature, the log-softmax, the gather and the
entropy run on ``chunk_size`` tokens at a time, in one :class:`torch.autograd.Function`
that saves only the hidden states ``(N, H)``, the head's weight and two floats per token;
its backward recomputes one chunk's logits at a time. Peak memory of the head falls from
a few ``(N, V)`` tensors to a few ``(chunk_size, V)`` ones; the values and gradients are
the full path's up to float32 rounding.

Hand-written rather than borrowed: Liger-Kernel's fused linear cross-entropy is Triton
only (no CPU); cut-cross-entropy (``linear_cross_entropy``) is Triton first and returns
cross-entropy losses only, not the entropy of the distribution, which the policy loss's
entropy bonus and the logged entropy need. verl's ``FusedLinearForPPO`` (torch, chunked)
is the same idea inside verl. The head's extras are applied as transformers does:
a ``logit_scale`` multiplier (Cohere) or ``1 / logits_scaling`` (Granite), then
``final_logit_softcapping`` (Gemma 2/3: ``cap * tanh(logits / cap)``), then the sampling
temperature (``logits / T``, as the sampler did).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_CHUNK_ELEMENTS = 1 << 25
"""Logits per chunk when ``logprob_chunk_size`` is automatic: 32M float32 values (128 MiB),
so 682 tokens of SmolLM2's 49k vocabulary and 128 of Gemma 3's 262k."""


@dataclass(frozen=True)
class HeadMath:
    """What turns the output projection into the logits the sampler saw.

    ``logits = softcap(scale * (h @ W.T + b)) / temperature``, ``softcap(x) = cap *
    tanh(x / cap)`` when ``softcap`` is set.
    """

    scale: float = 1.0
    """Multiplier on the projection (Cohere's ``logit_scale``, Granite's ``1/logits_scaling``)."""
    softcap: float | None = None
    """``final_logit_softcapping`` of the model's config (Gemma 2/3), or ``None``."""
    temperature: float = 1.0
    """Sampling temperature the logits are divided by."""


def chunk_tokens(chunk_size: int | None, vocab_size: int) -> int:
    """Tokens per chunk: ``chunk_size`` itself, or (``None``) :data:`DEFAULT_CHUNK_ELEMENTS`
    logits' worth of tokens for a ``vocab_size`` vocabulary (at least one)."""
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size} must be >= 1 (or None: automatic)")
        return chunk_size
    return max(1, DEFAULT_CHUNK_ELEMENTS // max(1, vocab_size))


def _logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    math: HeadMath,
    keep_tanh: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float32 logits ``(C, V)`` of one chunk, and with ``keep_tanh`` the softcap's ``tanh``
    (``None`` without a softcap): the backward's derivative ``1 - tanh^2`` needs it."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if math.scale != 1.0:
        logits.mul_(math.scale)
    tanh = None
    if math.softcap is not None:
        tanh = logits.div_(math.softcap).tanh_()
        logits = tanh * math.softcap if keep_tanh else tanh.mul_(math.softcap)
    if math.temperature != 1.0:
        logits.div_(math.temperature)
    return logits, tanh if keep_tanh else None


def _chunk_forward(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log-prob of targets, entropy, logsumexp)`` of float32 ``logits`` ``(C, V)``; one
    more ``(C, V)`` tensor at a time."""
    peak = logits.amax(dim=-1, keepdim=True)
    weights = (logits - peak).exp_()
    total = weights.sum(dim=-1)
    lse = peak.squeeze(-1) + total.log()
    expected = weights.mul_(logits).sum(dim=-1) / total  # E_p[z]
    entropy = lse - expected
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - lse, entropy, lse


def _logits_grad(
    logits: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    grad_log_probs: torch.Tensor | None,
    grad_entropy: torch.Tensor | None,
) -> torch.Tensor:
    """d(loss)/d(logits) ``(C, V)`` float32, in ``logits``' storage.

    ``d logp_t / dz = onehot_t - p``; ``d H / dz = -p * (log p + H)``.
    """
    log_p = logits.sub_(lse.unsqueeze(-1))
    p = log_p.exp()
    if grad_entropy is not None:
        grad = log_p.add_(entropy.unsqueeze(-1)).mul_(p).mul_(-grad_entropy.unsqueeze(-1))
    else:
        grad = log_p.zero_()
    if grad_log_probs is not None:
        grad.sub_(p.mul_(grad_log_probs.unsqueeze(-1)))
        grad.scatter_add_(-1, targets.unsqueeze(-1), grad_log_probs.unsqueeze(-1))
    return grad


class ChunkedLogProbs(torch.autograd.Function):
    """``(log_probs, entropy)`` ``(...)`` float32 of ``targets`` ``(...)`` under the head's
    logits of ``hidden`` ``(..., H)``, computed and differentiated ``chunk`` tokens at a
    time."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        math: HeadMath,
        chunk: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both outputs, one chunk's logits at a time; saves hidden states, not logits."""
        flat_hidden = hidden.reshape(-1, hidden.shape[-1])
        flat_targets = targets.reshape(-1)
        outputs = [
            _chunk_forward(
                _logits(flat_hidden[i : i + chunk], weight, bias, math)[0],
                flat_targets[i : i + chunk],
            )
            for i in range(0, max(1, flat_hidden.shape[0]), chunk)  # one, maybe empty
        ]
        log_probs, entropy = (hidden.new_empty(targets.shape, dtype=torch.float32) for _ in "ab")
        torch.cat([out[0] for out in outputs], out=log_probs.view(-1))
        torch.cat([out[1] for out in outputs], out=entropy.view(-1))
        lse = torch.cat([out[2] for out in outputs])
        ctx.save_for_backward(flat_hidden, weight, bias, flat_targets, lse, entropy.view(-1))
        ctx.math, ctx.chunk, ctx.hidden_shape = math, chunk, hidden.shape
        ctx.set_materialize_grads(False)
        # Outputs that are not views: FSDP2 warns of views (an in-place op would drop its
        # pre-backward hook).
        return log_probs, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        """Gradients of hidden states, weight and bias, recomputing one chunk's logits at a
        time; an output whose gradient is ``None`` (entropy unused) adds nothing."""
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        math, chunk = ctx.math, ctx.chunk
        if grad_log_probs is None and grad_entropy is None:
            return None, None, None, None, None, None
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        if grad_log_probs is not None:
            grad_log_probs = grad_log_probs.reshape(-1)
        if grad_entropy is not None:
            grad_entropy = grad_entropy.reshape(-1)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if need_bias else None
        # Only tokens with a gradient are recomputed: padding, and positions a loss weighs
        # 0 (a prompt's, under a Tinker client's loss), add nothing.
        live = _live_tokens(grad_log_probs, grad_entropy)
        for i in range(0, live.numel(), chunk):
            rows = live[i : i + chunk]
            logits, tanh = _logits(hidden[rows], weight, bias, math, keep_tanh=True)
            grad = _logits_grad(
                logits,
                targets[rows],
                lse[rows],
                entropy[rows],
                None if grad_log_probs is None else grad_log_probs[rows],
                None if grad_entropy is None else grad_entropy[rows],
            )
            # Back through /T, softcap (d cap*tanh(x/cap) = 1 - tanh^2) and the scale.
            grad.mul_(math.scale / math.temperature)
            if tanh is not None:
                grad.mul_(tanh.square_().neg_().add_(1.0))
            if grad_hidden is not None:
                grad_hidden[rows] = grad.to(weight.dtype) @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad.t(), hidden[rows].float())
            if grad_bias is not None:
                grad_bias.add_(grad.sum(dim=0))
        return (
            None if grad_hidden is None else grad_hidden.view(ctx.hidden_shape),
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
            None,
        )


def _live_tokens(
    grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None
) -> torch.Tensor:
    """Indices of the tokens whose log-prob or entropy gradient is not zero, ``(n,)`` long."""
    grads = [g for g in (grad_log_probs, grad_entropy) if g is not None]
    live = grads[0] != 0
    for grad in grads[1:]:
        live |= grad != 0
    return live.nonzero().squeeze(-1)


def chunked_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    math: HeadMath,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``targets`` and entropy under ``softcap(scale * (hidden @ weight.T +
    bias)) / temperature``, without the ``(N, V)`` logits of all tokens at once.

    ``chunk_size``: tokens per chunk (``None``: :func:`chunk_tokens`'s automatic size).

    Shape: hidden ``(..., H)``, weight ``(V, H)``, bias ``(V,)``, targets ``(...)`` int64 ->
    ``((...), (...))`` float32.
    """
    if math.temperature <= 0:
        raise ValueError(f"temperature={math.temperature!r} must be > 0")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} does not line up with targets {tuple(targets.shape)}"
        )
    chunk = chunk_tokens(chunk_size, weight.shape[0])
    log_probs, entropy = ChunkedLogProbs.apply(hidden, weight, bias, targets, math, chunk)
    return log_probs, entropy
