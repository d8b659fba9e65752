"""The rollout engine interface and the pieces every backend shares.

A backend turns prompts into sampled token ids and their log-probs; everything else (reading
prompts in either form, checking the length limit, joining prompt and response, position ids,
masks, repeating non-tensor columns ``n`` times) is done here, the same way for all backends,
so their outputs are interchangeable.

Shapes: ``B`` prompts, ``P`` padded prompt width, ``n`` samples per prompt, ``R`` padded
response width (the longest generated response of the call).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from hf_protocol import (
    DataProto,
    continue_position_ids,
    fields,
    left_pad,
    position_ids_from_mask,
    right_pad,
)
from hf_rollout.config import SamplingConfig

PROMPT_KEYS = (fields.INPUT_IDS, fields.ATTENTION_MASK, fields.POSITION_IDS)
"""Tensor columns a prompt batch carries (left-padded, shape ``(B, P)``); the non-tensor
``raw_prompt_ids`` (one unpadded token list per prompt) is accepted instead."""


@runtime_checkable
class RolloutEngine(Protocol):
    """A generation engine: prompts in, sampled responses with log-probs out."""

    def generate(self, prompts: DataProto, sampling: SamplingConfig) -> DataProto:
        """Sample ``sampling.n`` responses per prompt; see :func:`build_rollout_output`."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full tensors named as in the Hugging Face ``state_dict()``."""
        ...

    def sleep(self) -> None:
        """Free the KV cache (and other generation memory) while training runs."""
        ...

    def wake_up(self) -> None:
        """Restore what :meth:`sleep` freed."""
        ...

    def shutdown(self) -> None:
        """Release every resource; the engine is unusable afterwards."""
        ...


def read_prompts(
    prompts: DataProto, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prompt tensors ``input_ids``, ``attention_mask``, ``position_ids`` (B, P).

    Taken from the batch when it has ``input_ids`` (``attention_mask`` defaults to
    ``input_ids != pad``, ``position_ids`` to the mask's cumulative count), else built by
    left-padding ``non_tensor_batch["raw_prompt_ids"]``.
    """
    batch = prompts.batch
    if batch is not None and fields.INPUT_IDS in batch:
        input_ids = batch[fields.INPUT_IDS].long()
        if fields.ATTENTION_MASK in batch:
            attention_mask = batch[fields.ATTENTION_MASK].long()
        else:
            attention_mask = (input_ids != pad_token_id).long()
        if fields.POSITION_IDS in batch:
            position_ids = batch[fields.POSITION_IDS].long()
        else:
            position_ids = position_ids_from_mask(attention_mask)
        if position_ids.dim() != 2:
            raise ValueError(
                f"position_ids must have shape (B, P), got {tuple(position_ids.shape)}; "
                "multi-axis (e.g. mrope) positions are not supported by hf_rollout"
            )
        return input_ids, attention_mask, position_ids
    if fields.RAW_PROMPT_IDS in prompts.non_tensor_batch:
        raw = [list(map(int, ids)) for ids in prompts.non_tensor_batch[fields.RAW_PROMPT_IDS]]
        return left_pad(raw, pad_token_id)
    if len(prompts) == 0:
        empty = torch.zeros((0, 0), dtype=torch.long)
        return empty, empty.clone(), empty.clone()
    tensors = sorted(batch.keys()) if batch is not None else []
    raise ValueError(
        "prompts need tensor 'input_ids' (left-padded, with 'attention_mask' and "
        f"'position_ids') or non-tensor '{fields.RAW_PROMPT_IDS}' (token lists); got tensors "
        f"{tensors} and non-tensors {sorted(prompts.non_tensor_batch)}"
    )


def check_prompt_lengths(attention_mask: torch.Tensor, max_model_len: int) -> int:
    """The longest prompt (real tokens); error if one is empty or leaves no room to generate."""
    lengths = attention_mask.sum(dim=-1)
    if lengths.numel() == 0:
        return 0
    empty = (lengths == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"prompt rows {empty[:10]} have no tokens; every prompt needs >= 1 token")
    longest = int(lengths.max())
    if longest >= max_model_len:
        row = int(lengths.argmax())
        raise ValueError(
            f"prompt row {row} has {longest} tokens, but max_model_len={max_model_len} "
            "(prompt + response) leaves no room to generate; shorten the prompt or raise "
            "RolloutConfig.max_model_len"
        )
    return longest


def stop_ids_for(sampling: SamplingConfig, model_eos: Iterable[int] = ()) -> list[int]:
    """Ids that end a sample: ``stop_token_ids`` plus the eos (the model's when unset)."""
    eos = [sampling.eos_token_id] if sampling.eos_token_id is not None else list(model_eos)
    return sorted({*sampling.stop_token_ids, *eos})


def mask_through_first_stop(tokens: torch.Tensor, stop_ids: Sequence[int]) -> torch.Tensor:
    """1 for every token up to and including the first stop id of its row, 0 after.

    Shape: ``(B, R)`` -> ``(B, R)`` long. For backends that return fixed-length samples.
    """
    if not len(stop_ids) or tokens.numel() == 0:
        return torch.ones_like(tokens, dtype=torch.long)
    is_stop = torch.isin(tokens, torch.as_tensor(list(stop_ids), device=tokens.device))
    stops_before = is_stop.long().cumsum(dim=-1) - is_stop.long()
    return (stops_before == 0).long()


def build_rollout_output(
    prompts: DataProto,
    prompt_tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    n: int,
    temperature: float,
    pad_token_id: int,
    response_attention_mask: torch.Tensor | None = None,
) -> DataProto:
    """The ``generate`` result: a new DataProto of ``B * n`` rows (each prompt ``n`` times).

    ``prompt_tensors`` are the ``(B, P)`` prompt ``input_ids`` / ``attention_mask`` /
    ``position_ids``; ``responses``, ``response_mask``, ``rollout_log_probs`` are
    ``(B * n, R)`` with rows grouped by prompt. Pads of ``responses`` are overwritten with
    ``pad_token_id`` and log-probs zeroed there. ``response_attention_mask`` (default:
    ``response_mask``) is what the joined ``attention_mask`` holds for the response: a
    multi-turn rollout attends to tool tokens that ``response_mask`` excludes from the loss.
    Non-tensor columns and other tensor columns of ``prompts`` are repeated alongside;
    ``meta_info`` is copied with ``temperature`` set.
    """
    input_ids, attention_mask, position_ids = prompt_tensors
    rows = input_ids.shape[0] * n
    if responses.shape[0] != rows:
        raise ValueError(
            f"expected {rows} response rows (B={input_ids.shape[0]} x n={n}), "
            f"got {responses.shape[0]}"
        )
    response_mask = response_mask.long()
    seen = response_mask if response_attention_mask is None else response_attention_mask.long()
    responses = responses.long().masked_fill(seen == 0, pad_token_id)
    log_probs = rollout_log_probs.float().masked_fill(response_mask == 0, 0.0)

    def rep(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.repeat_interleave(n, dim=0)

    prompt_ids, prompt_mask, prompt_pos = rep(input_ids), rep(attention_mask), rep(position_ids)
    # Positions keep counting over the response's pads (verl's rollout layout).
    response_pos = continue_position_ids(prompt_pos, responses.shape[1])
    tensors: dict[str, torch.Tensor] = {}
    if prompts.batch is not None:
        for key in prompts.batch.keys():  # noqa: SIM118 (iterating a TensorDict walks rows)
            if key not in PROMPT_KEYS:
                tensors[str(key)] = rep(prompts.batch[key])
    tensors[fields.PROMPTS] = prompt_ids
    tensors[fields.RESPONSES] = responses
    tensors[fields.RESPONSE_MASK] = response_mask
    tensors[fields.ROLLOUT_LOG_PROBS] = log_probs
    tensors[fields.INPUT_IDS] = torch.cat([prompt_ids, responses], dim=1)
    tensors[fields.ATTENTION_MASK] = torch.cat([prompt_mask, seen], dim=1)
    tensors[fields.POSITION_IDS] = torch.cat([prompt_pos, response_pos], dim=1)
    order = np.repeat(np.arange(len(prompts)), n)
    non_tensors = {key: value[order] for key, value in prompts.non_tensor_batch.items()}
    meta = {**prompts.meta_info, fields.TEMPERATURE: float(temperature)}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def build_output_from_samples(
    prompts: DataProto,
    prompt_tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    samples: Sequence[Sequence[int]],
    log_probs: Sequence[Sequence[float]],
    sampling: SamplingConfig,
    pad_token_id: int,
) -> DataProto:
    """:func:`build_rollout_output` from one token list and one log-prob list per sample.

    For engines that hand back Python lists (vLLM, SGLang): ``samples`` and ``log_probs``
    hold ``B * n`` lists grouped by prompt, right-padded here to the longest. No samples
    (no prompts) give an empty batch.
    """
    responses, response_mask = right_pad(samples, pad_token_id, dtype=torch.int64)
    rollout_log_probs, _ = right_pad(log_probs, 0.0, dtype=torch.float32)
    return build_rollout_output(
        prompts, prompt_tensors, responses, response_mask, rollout_log_probs, sampling.n,
        sampling.effective_temperature, pad_token_id,
    )  # fmt: skip


def pad_responses_to(output: DataProto, width: int, pad_token_id: int) -> DataProto:
    """``output`` of :func:`build_rollout_output` with responses right-padded to ``width``.

    Shards generated on different ranks then have equal shapes and concatenate. Response
    columns grow with pad / 0; the joined columns grow likewise, position ids keep counting.
    A response already wider than ``width`` is an error.
    """
    assert output.batch is not None
    batch = output.batch
    extra = width - batch[fields.RESPONSES].shape[1]
    if extra < 0:
        raise ValueError(f"responses are {width + -extra} wide, more than width={width}")
    if extra == 0:
        return output
    rows = batch[fields.RESPONSES].shape[0]

    def grow(key: str, value: float) -> torch.Tensor:
        tensor = batch[key]
        return torch.cat([tensor, tensor.new_full((rows, extra), value)], dim=1)

    positions = batch[fields.POSITION_IDS]
    tensors = {str(key): batch[key] for key in batch.keys()}  # noqa: SIM118
    tensors[fields.RESPONSES] = grow(fields.RESPONSES, pad_token_id)
    tensors[fields.RESPONSE_MASK] = grow(fields.RESPONSE_MASK, 0)
    tensors[fields.ROLLOUT_LOG_PROBS] = grow(fields.ROLLOUT_LOG_PROBS, 0.0)
    tensors[fields.INPUT_IDS] = grow(fields.INPUT_IDS, pad_token_id)
    tensors[fields.ATTENTION_MASK] = grow(fields.ATTENTION_MASK, 0)
    tensors[fields.POSITION_IDS] = torch.cat(
        [positions, continue_position_ids(positions, extra)], dim=1
    )
    return DataProto.from_dict(
        tensors=tensors,
        non_tensors=output.non_tensor_batch,
        meta_info=output.meta_info,
    )
