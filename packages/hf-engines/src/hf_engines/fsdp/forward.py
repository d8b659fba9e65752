"""One forward pass of a transformers model over a micro-batch, with or without padding.

Every function returns the outputs at the response positions, ``(B, R)`` float32, with
zeros where :func:`~hf_engines.fsdp.unpad.scored_response_mask` is false, so the padded,
trimmed and packed paths give the same tensors. With a ``scorer``
(:class:`~hf_engines.output_head.TokenScorer`) the log-probs and entropy come from the
hidden states a chunk of tokens at a time; without one, from the logits of every response
position at once.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_engines.engine import ModelOutputs
from hf_engines.fsdp.outputs import map_outputs, token_log_probs
from hf_engines.fsdp.unpad import (
    PaddingMode,
    pack_rows,
    pad_responses,
    scatter_scored,
    scored_response_mask,
    trim_window,
)
from hf_engines.logprob import response_positions
from hf_engines.output_head import TokenScorer
from hf_protocol import fields


def forward_padded(
    model: torch.nn.Module,
    inputs: dict[str, Any],
    responses: torch.Tensor,
    value_head: bool,
    temperature: float,
    scorer: TokenScorer | None = None,
) -> ModelOutputs:
    """The model on ``(B, T)`` rows as given (``inputs``: ids, attention mask, positions)."""
    response_length = responses.shape[1]
    if value_head:
        logits = model(**inputs, use_cache=False).logits
        return {"values": response_positions(logits, response_length)[..., 0].float()}
    if scorer is not None:
        select = (slice(None), slice(-response_length - 1, -1))
        inputs = {**inputs, "use_cache": False}
        return scorer(model, inputs, select, responses, temperature)
    # Only the positions that predict response tokens need logits: saves a (B, T, V) tensor.
    logits = model(**inputs, use_cache=False, logits_to_keep=response_length + 1).logits
    return token_log_probs(logits[:, :-1], responses, temperature)


def forward_trimmed(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    responses: torch.Tensor,
    value_head: bool,
    temperature: float,
    scorer: TokenScorer | None = None,
) -> ModelOutputs:
    """:func:`forward_padded` on the columns that are not padding in every row."""
    response_length = responses.shape[1]
    start, stop = trim_window(inputs[fields.ATTENTION_MASK], response_length)
    kept = stop - (inputs[fields.ATTENTION_MASK].shape[1] - response_length)
    trimmed = {key: value[:, start:stop] for key, value in inputs.items()}
    outputs = forward_padded(model, trimmed, responses[:, :kept], value_head, temperature, scorer)
    return map_outputs(outputs, lambda value: pad_responses(value, response_length))


def forward_packed(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    responses: torch.Tensor,
    value_head: bool,
    temperature: float,
    scorer: TokenScorer | None = None,
) -> ModelOutputs | None:
    """The model on every real token packed into one row; ``None`` if it cannot pack."""
    shape = (responses.shape[0], responses.shape[1])
    packed = pack_rows(
        inputs[fields.INPUT_IDS],
        inputs[fields.ATTENTION_MASK],
        inputs[fields.POSITION_IDS],
        shape[1],
    )
    if packed is None:
        return None
    # No attention mask: transformers reads the position restarts as sequence boundaries.
    model_inputs: dict[str, Any] = {
        "input_ids": packed.input_ids,
        "position_ids": packed.position_ids,
    }
    if value_head:
        # use_cache=False matters: with a cache transformers would not look for packing.
        values = model(**model_inputs, use_cache=False).logits[0, packed.predict_index, 0]
        return {"values": scatter_scored(values, packed.rows, packed.cols, shape)}
    targets = responses[packed.rows, packed.cols].unsqueeze(0)
    if scorer is not None:
        select = (slice(None), packed.predict_index)
        outputs = scorer(model, {**model_inputs, "use_cache": False}, select, targets, temperature)
    else:
        keep = packed.predict_index
        logits = model(**model_inputs, use_cache=False, logits_to_keep=keep).logits
        outputs = token_log_probs(logits, targets, temperature)
    return map_outputs(outputs, lambda v: scatter_scored(v[0], packed.rows, packed.cols, shape))


def forward_micro_batch(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    responses: torch.Tensor,
    value_head: bool,
    temperature: float,
    mode: PaddingMode,
    scorer: TokenScorer | None = None,
) -> ModelOutputs:
    """Outputs at the response positions, skipping padding as ``mode`` says.

    ``pack`` falls back to ``trim`` for a micro-batch it cannot pack (see ``pack_rows``).
    """
    outputs: ModelOutputs | None = None
    if mode == "pack":
        outputs = forward_packed(model, inputs, responses, value_head, temperature, scorer)
    if outputs is None:
        forward = forward_padded if mode == "off" else forward_trimmed
        outputs = forward(model, inputs, responses, value_head, temperature, scorer)
        scored = scored_response_mask(inputs[fields.ATTENTION_MASK], responses.shape[1])
        outputs = map_outputs(outputs, lambda value: value * scored)
    return outputs
