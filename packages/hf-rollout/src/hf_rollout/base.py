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

from hf_protocol import DataProto
from hf_rollout.config import SamplingConfig

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")
"""Tensor columns a prompt batch carries (left-padded, shape ``(B, P)``)."""
RAW_PROMPT_KEY = "raw_prompt_ids"
"""Non-tensor column accepted instead: one list of token ids per prompt, unpadded."""


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


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting real tokens from 0; pads before the first token get 0.

    Shape: ``(B, L)`` -> ``(B, L)``.
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def left_pad(
    token_lists: Sequence[Sequence[int]], pad_token_id: int, min_width: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ``input_ids``, ``attention_mask``, ``position_ids`` (B, P).

    ``P`` is the longest list, or ``min_width`` when that is larger.
    """
    width = max(min_width, *(len(tokens) for tokens in token_lists), 0)
    input_ids = torch.full((len(token_lists), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(token_lists), width), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        if len(tokens):
            input_ids[row, width - len(tokens) :] = torch.as_tensor(list(tokens), dtype=torch.long)
            attention_mask[row, width - len(tokens) :] = 1
    return input_ids, attention_mask, position_ids_from_mask(attention_mask)


def right_pad(
    sequences: Sequence[Sequence[float]] | Sequence[Sequence[int]],
    pad_value: float,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad sequences into a ``(B, R)`` tensor and its 0/1 mask (long).

    For backends that return one list of tokens (or log-probs) per sample.
    """
    width = max((len(values) for values in sequences), default=0)
    out = torch.full((len(sequences), width), pad_value, dtype=dtype)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, values in enumerate(sequences):
        if len(values):
            out[row, : len(values)] = torch.as_tensor(list(values), dtype=dtype)
            mask[row, : len(values)] = 1
    return out, mask


def read_prompts(
    prompts: DataProto, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prompt tensors ``input_ids``, ``attention_mask``, ``position_ids`` (B, P).

    Taken from the batch when it has ``input_ids`` (``attention_mask`` defaults to
    ``input_ids != pad``, ``position_ids`` to the mask's cumulative count), else built by
    left-padding ``non_tensor_batch["raw_prompt_ids"]``.
    """
    batch = prompts.batch
    if batch is not None and "input_ids" in batch:
        input_ids = batch["input_ids"].long()
        if "attention_mask" in batch:
            attention_mask = batch["attention_mask"].long()
        else:
            attention_mask = (input_ids != pad_token_id).long()
        if "position_ids" in batch:
            position_ids = batch["position_ids"].long()
        else:
            position_ids = position_ids_from_mask(attention_mask)
        if position_ids.dim() != 2:
            raise ValueError(
                f"position_ids must have shape (B, P), got {tuple(position_ids.shape)}; "
                "multi-axis (e.g. mrope) positions are not supported by hf_rollout"
            )
        return input_ids, attention_mask, position_ids
    if RAW_PROMPT_KEY in prompts.non_tensor_batch:
        raw = [list(map(int, ids)) for ids in prompts.non_tensor_batch[RAW_PROMPT_KEY]]
        return left_pad(raw, pad_token_id)
    if len(prompts) == 0:
        empty = torch.zeros((0, 0), dtype=torch.long)
        return empty, empty.clone(), empty.clone()
    tensors = sorted(batch.keys()) if batch is not None else []
    raise ValueError(
        "prompts need tensor 'input_ids' (left-padded, with 'attention_mask' and "
        f"'position_ids') or non-tensor '{RAW_PROMPT_KEY}' (token lists); got tensors "
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
    width = responses.shape[1]
    last = prompt_pos[:, -1:] if prompt_pos.shape[1] else torch.full((rows, 1), -1)
    offsets = torch.arange(1, width + 1, device=prompt_pos.device).unsqueeze(0)
    tensors: dict[str, torch.Tensor] = {}
    if prompts.batch is not None:
        for key in prompts.batch.keys():  # noqa: SIM118 (iterating a TensorDict walks rows)
            if key not in PROMPT_KEYS:
                tensors[str(key)] = rep(prompts.batch[key])
    tensors.update(
        prompts=prompt_ids,
        responses=responses,
        response_mask=response_mask,
        rollout_log_probs=log_probs,
        input_ids=torch.cat([prompt_ids, responses], dim=1),
        attention_mask=torch.cat([prompt_mask, seen], dim=1),
        position_ids=torch.cat([prompt_pos, last + offsets], dim=1),
    )
    order = np.repeat(np.arange(len(prompts)), n)
    non_tensors = {key: value[order] for key, value in prompts.non_tensor_batch.items()}
    meta = {**prompts.meta_info, "temperature": float(temperature)}
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
    responses, response_mask = right_pad(samples, pad_token_id, torch.long)
    rollout_log_probs, _ = right_pad(log_probs, 0.0, torch.float32)
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
    extra = width - batch["responses"].shape[1]
    if extra < 0:
        raise ValueError(f"responses are {width + -extra} wide, more than width={width}")
    if extra == 0:
        return output
    rows = batch["responses"].shape[0]

    def grow(tensor: torch.Tensor, value: float) -> torch.Tensor:
        return torch.cat([tensor, tensor.new_full((rows, extra), value)], dim=1)

    last = batch["position_ids"][:, -1:]
    more_positions = last + torch.arange(1, extra + 1, device=last.device).unsqueeze(0)
    tensors = {key: batch[key] for key in batch.keys()}  # noqa: SIM118
    tensors.update(
        responses=grow(batch["responses"], pad_token_id),
        response_mask=grow(batch["response_mask"], 0),
        rollout_log_probs=grow(batch["rollout_log_probs"], 0.0),
        input_ids=grow(batch["input_ids"], pad_token_id),
        attention_mask=grow(batch["attention_mask"], 0),
        position_ids=torch.cat([batch["position_ids"], more_positions], dim=1),
    )
    return DataProto.from_dict(
        tensors={str(k): v for k, v in tensors.items()},
        non_tensors=output.non_tensor_batch,
        meta_info=output.meta_info,
    )
