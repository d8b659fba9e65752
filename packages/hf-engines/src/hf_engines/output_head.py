"""A causal LM's output head taken apart: decoder body, ``lm_head`` and the logit extras.

:func:`output_head` finds them on a transformers model; :func:`head_matches_model` checks,
on two tokens, that body + head give the model's own logits (a model whose forward does
more than the extras known here fails it, and keeps the full-logits path);
:func:`model_token_log_probs` runs the model through its own ``__call__`` (so FSDP2's
hooks gather and reshard the parameters as for a plain forward) with a forward that
returns the chunked log-probs and entropy (:mod:`hf_engines.chunked_logprob`) instead of
the logits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from hf_engines.chunked_logprob import HeadMath, chunked_log_probs
from hf_engines.engine import ModelOutputs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputHead:
    """The parts of a causal LM between its last hidden states and its logits."""

    body: torch.nn.Module
    """The decoder (``model.base_model``): returns ``last_hidden_state`` ``(B, T, H)``."""
    projection: torch.nn.Linear
    """``lm_head`` (read at call time: FSDP2 swaps its weight for the gathered one)."""
    math: HeadMath
    """Scale and softcap after the projection (temperature 1)."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's float32 logits of ``hidden`` ``(..., H)`` -> ``(..., V)``."""
        logits = self.projection(hidden).float() * self.math.scale
        cap = self.math.softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap


def output_head(model: torch.nn.Module) -> OutputHead | None:
    """The model's :class:`OutputHead`, or ``None`` when it has none that is a plain
    linear layer over a separate decoder body (e.g. a LoRA-adapted ``lm_head``)."""
    get_head = getattr(model, "get_output_embeddings", None)
    projection = get_head() if callable(get_head) else None
    body = getattr(model, "base_model", None)
    if type(projection) is not torch.nn.Linear or body is None or body is model:
        return None
    config = getattr(model, "config", None)
    scale = float(getattr(model, "logit_scale", None) or 1.0)  # Cohere
    scaling = getattr(config, "logits_scaling", None)  # Granite
    if scaling:
        scale /= float(scaling)
    softcap = getattr(config, "final_logit_softcapping", None)  # Gemma 2/3
    return OutputHead(body, projection, HeadMath(scale=scale, softcap=softcap))


@torch.no_grad()
def head_matches_model(model: torch.nn.Module, head: OutputHead) -> bool:
    """Whether ``head`` applied to the body's hidden states gives ``model``'s own logits
    (two tokens, eval mode, within the dtype's rounding)."""
    training = model.training
    model.eval()
    try:
        ids = torch.tensor([[1, 2]], device=head.projection.weight.device)
        expected = model(input_ids=ids, use_cache=False).logits.float()
        hidden = head.body(input_ids=ids, use_cache=False).last_hidden_state
        actual = head.logits(hidden)
    finally:
        model.train(training)
    if actual.shape != expected.shape:
        return False
    dtype = head.projection.weight.dtype
    tolerance = 16 * torch.finfo(dtype).eps * max(1.0, float(expected.abs().max()))
    return bool((actual - expected).abs().max() <= tolerance)


@contextmanager
def _forward_replaced(model: torch.nn.Module, forward: Any) -> Iterator[None]:
    """``model.forward`` is ``forward`` within the block (an instance attribute, so
    ``model(...)`` still runs the module's hooks around it)."""
    model.forward = forward
    try:
        yield
    finally:
        del model.forward


def model_token_log_probs(
    model: torch.nn.Module,
    head: OutputHead,
    inputs: dict[str, Any],
    select: Any,
    targets: torch.Tensor,
    temperature: float,
    chunk_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``targets`` and entropy at the positions ``select`` picks from the
    body's hidden states, at ``temperature``: the model's logits there, never built for
    more than one chunk of tokens at a time.

    ``select``: an index into ``(B, T, H)`` hidden states giving ``targets.shape + (H,)``
    (e.g. ``(slice(None), slice(-R - 1, -1))``).

    Shape: ``inputs`` as for ``model(**inputs)``, targets ``(...)`` -> ``((...), (...))``
    float32.
    """
    math = replace(head.math, temperature=temperature)

    def forward(**kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = head.body(**kwargs).last_hidden_state[select]
        weight, bias = head.projection.weight, head.projection.bias
        return chunked_log_probs(hidden, weight, bias, targets, math, chunk_size)

    with _forward_replaced(model, forward):
        result: tuple[torch.Tensor, torch.Tensor] = model(**inputs)
    return result


@dataclass(frozen=True)
class TokenScorer:
    """Scores given tokens through :func:`model_token_log_probs` with one model's head."""

    head: OutputHead
    """The model's head, checked by :func:`head_matches_model`."""
    chunk_size: int | None
    """Tokens per chunk; ``None``: automatic (:func:`~hf_engines.chunked_logprob.chunk_tokens`)."""

    def __call__(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        select: Any,
        targets: torch.Tensor,
        temperature: float,
    ) -> ModelOutputs:
        """``log_probs`` and ``entropy`` of ``targets`` (see :func:`model_token_log_probs`)."""
        log_probs, entropy = model_token_log_probs(
            model, self.head, inputs, select, targets, temperature, self.chunk_size
        )
        return {"log_probs": log_probs, "entropy": entropy}

    def fits(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` still has this head (not, e.g., once LoRA adapted ``lm_head``)."""
        return output_head(model) == self.head


def token_scorer(model: torch.nn.Module, chunk_size: int | None) -> TokenScorer | None:
    """A :class:`TokenScorer` for ``model``; ``None`` (the full-logits path) when
    ``chunk_size`` is 0 or the model's head cannot be taken apart (logged)."""
    if chunk_size == 0:
        return None
    head = output_head(model)
    if head is None or not head_matches_model(model, head):
        logger.warning(
            "%s: log-probs are computed from full-vocabulary logits (logprob_chunk_size "
            "ignored): its output head is not lm_head plus the logit scale/softcap known here",
            type(model).__name__,
        )
        return None
    return TokenScorer(head, chunk_size)
