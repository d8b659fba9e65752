"""Running micro-batches through a (possibly pipelined) megatron model stage.

A plain GPipe schedule over ``torch.distributed`` send / recv: every stage runs all
forwards (passing hidden states ``(T, b, h)`` to the next stage), then all backwards in
reverse order (passing gradients back). With one stage it is an ordinary loop. megatron's
own schedules are not used because they allocate tensors with ``device="cuda"`` (a literal,
not ``current_device()``), which cannot run on the CPU.

Sequences are turned from "left-padded prompt + right-padded response" into plain
right-padded rows before the model sees them, so a causal mask alone is exact and rotary
positions start at 0 on the first real token, as transformers' ``position_ids`` do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel

from hf_engines.megatron.parallel import pipeline_rank_of_stage
from hf_engines.micro_batch import batch_tensors
from hf_protocol import DataProto, fields


@dataclass
class StageInput:
    """One micro-batch prepared for the model; ``(b, T)`` rows shifted to right padding."""

    input_ids: torch.Tensor
    """Token ids with each row's left padding moved to its end."""
    response_index: torch.Tensor
    """``(b, R)`` positions in the shifted rows whose outputs predict the response tokens."""
    responses: torch.Tensor
    """``(b, R)`` response token ids."""
    micro_batch: DataProto
    """The original micro-batch, handed to the loss function."""


def _check_contiguous(attention_mask: torch.Tensor) -> torch.Tensor:
    """Number of left-padding positions per row; rows must hold one contiguous run of 1s."""
    length = attention_mask.sum(dim=1)
    left = attention_mask.int().argmax(dim=1)
    positions = torch.arange(attention_mask.shape[1]).unsqueeze(0)
    expected = (positions >= left.unsqueeze(1)) & (positions < (left + length).unsqueeze(1))
    if not torch.equal(expected, attention_mask.bool()):
        raise ValueError(
            "the Megatron engine needs each row's attention_mask to be one contiguous run of "
            "1s (left-padded prompt + right-padded response); got a row with holes"
        )
    return left


def prepare(micro_batch: DataProto, device: torch.device) -> StageInput:
    """Shift each row left by its padding and locate the response-predicting positions."""
    tensors = batch_tensors(micro_batch)
    missing = [
        k for k in (fields.INPUT_IDS, fields.ATTENTION_MASK, fields.RESPONSES) if k not in tensors
    ]
    if missing:
        raise KeyError(
            f"batch lacks {missing}; the engine needs input_ids, attention_mask, responses"
        )
    input_ids, mask = tensors[fields.INPUT_IDS], tensors[fields.ATTENTION_MASK]
    responses = tensors[fields.RESPONSES]
    total, response_length = input_ids.shape[1], responses.shape[1]
    left = _check_contiguous(mask).unsqueeze(1)
    positions = torch.arange(total).unsqueeze(0)
    shifted = input_ids.gather(1, (positions + left) % total)
    predicting = torch.arange(total - response_length - 1, total - 1).unsqueeze(0)
    return StageInput(
        input_ids=shifted.to(device),
        response_index=((predicting - left) % total).to(device),
        responses=responses.to(device),
        micro_batch=micro_batch,
    )


def _causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """megatron's boolean mask convention: ``True`` = masked out; shape ``(1, 1, T, T)``."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), 1)[None, None]


def response_outputs(output: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows of the last stage's ``(b, T, V)`` output at ``index`` ``(b, R)`` -> ``(b, R, V)``."""
    return output.gather(1, index.unsqueeze(-1).expand(-1, -1, output.shape[-1]))


HeadFn = Callable[[torch.Tensor, StageInput], torch.Tensor | None]
"""Called on the last stage with ``(model output (b, T, V), input)``; returns a loss to
back-propagate (training) or ``None`` (forward only, the function keeps what it needs)."""


def _run_without_stages(
    model: GPTModel, inputs: list[StageInput], head_fn: HeadFn, backward: bool
) -> None:
    """One stage holds the whole model: forward each micro-batch, then at once its backward."""
    for item in inputs:
        batch, length = item.input_ids.shape
        positions = torch.arange(length, device=item.input_ids.device).expand(batch, -1)
        output = model(item.input_ids, positions, _causal_mask(length, item.input_ids.device))
        loss = head_fn(output, item)
        if backward:
            assert loss is not None, "a training head_fn must return a loss"
            loss.backward()


def run_schedule(
    model: GPTModel, inputs: list[StageInput], head_fn: HeadFn, hidden_size: int, backward: bool
) -> None:
    """Forward (and backward) every micro-batch through this stage; GPipe order.

    Without pipeline stages (PP=1) each micro-batch's backward runs right after its forward,
    so a step holds one micro-batch's activations (its full-vocabulary logits included), not
    the mini-batch's. With stages, GPipe keeps every micro-batch's activations until the
    backward pass (no 1F1B schedule here).
    """
    first = parallel_state.is_pipeline_first_stage()
    last = parallel_state.is_pipeline_last_stage()
    if first and last:
        _run_without_stages(model, inputs, head_fn, backward)
        return
    stage = parallel_state.get_pipeline_model_parallel_rank()
    group = parallel_state.get_pipeline_model_parallel_group()
    dtype = next(model.parameters()).dtype
    saved: list[tuple[torch.Tensor | None, torch.Tensor]] = []
    for item in inputs:
        batch, length = item.input_ids.shape
        received = None
        if not first:
            received = torch.empty(
                length, batch, hidden_size, dtype=dtype, device=item.input_ids.device
            )
            dist.recv(received, src=pipeline_rank_of_stage(stage - 1), group=group)
            received.requires_grad_(backward)
            model.set_input_tensor(received)
        positions = torch.arange(length, device=item.input_ids.device).expand(batch, -1)
        output = model(item.input_ids, positions, _causal_mask(length, item.input_ids.device))
        if last:
            loss = head_fn(output, item)
            if backward:
                assert loss is not None, "a training head_fn must return a loss"
                saved.append((received, loss))
        else:
            dist.send(
                output.detach().contiguous(), dst=pipeline_rank_of_stage(stage + 1), group=group
            )
            if backward:
                saved.append((received, output))
    if not backward:
        return
    for received, output in reversed(saved):
        if last:
            output.backward()
        else:
            grad = torch.empty_like(output)
            dist.recv(grad, src=pipeline_rank_of_stage(stage + 1), group=group)
            torch.autograd.backward(output, grad)
        if received is not None:
            assert received.grad is not None
            dist.send(
                received.grad.contiguous(), dst=pipeline_rank_of_stage(stage - 1), group=group
            )
