"""Running micro-batches through a (possibly pipelined) megatron model stage.

A 1F1B schedule over ``torch.distributed`` isend / irecv: each stage passes hidden states
``(T, b, h)`` to the next and their gradients back, interleaving one forward with one
backward once the pipeline is full. With one stage it is an ordinary loop. megatron's
own schedules are not used because they allocate tensors with ``device="cuda"`` (a literal,
not ``current_device()``), which cannot run on the CPU.

Sequences are turned from "left-padded prompt + right-padded response" into plain
right-padded rows before the model sees them, so a causal mask alone is exact and rotary
positions start at 0 on the first real token, as transformers' ``position_ids`` do.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel

from hf_engines.megatron.parallel import pipeline_rank_of_stage
from hf_engines.megatron.routing import replaying, shift_rows
from hf_engines.micro_batch import batch_tensors
from hf_protocol import DataProto, fields
from hf_protocol.routing import ROUTED_EXPERTS


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
    routed_experts: torch.Tensor | None = None
    """``(b, T, L, k)`` recorded experts shifted like ``input_ids`` (router replay), or None."""


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
    """Shift each row left by its padding and locate the response-predicting positions
    (the recorded ``routed_experts``, when the batch has them, are shifted alike)."""
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
    has_routing = ROUTED_EXPERTS in tensors.keys()  # noqa: SIM118 (a TensorDict)
    routed = tensors[ROUTED_EXPERTS] if has_routing else None
    return StageInput(
        input_ids=shifted.to(device),
        response_index=((predicting - left) % total).to(device),
        responses=responses.to(device),
        micro_batch=micro_batch,
        routed_experts=None if routed is None else shift_rows(routed, left).to(device),
    )


def _causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """megatron's boolean mask convention: ``True`` = masked out; shape ``(1, 1, T, T)``."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), 1)[None, None]


@contextmanager
def outputs_at(model: GPTModel, index: torch.Tensor) -> Iterator[None]:
    """Within the block, ``model``'s output layer sees only the hidden states at ``index``
    ``(b, R)`` (the response-predicting positions), so the model returns ``(b, R, V)``.

    transformers' ``logits_to_keep``, which the FSDP engine uses, for megatron's
    ``GPTModel``: the full-vocabulary logits of the prompt positions, ``T / R`` times the
    memory the loss needs, are never computed. The gather runs before the output layer
    (a forward pre-hook on ``output_layer``, whose input is ``(T, b, h)``).
    """

    def select(module: torch.nn.Module, args: tuple[object, ...]) -> tuple[object, ...]:
        hidden = args[0]
        assert isinstance(hidden, torch.Tensor)
        rows = index.t().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])  # (R, b, h)
        return (hidden.gather(0, rows), *args[1:])

    handle = model.output_layer.register_forward_pre_hook(select)
    try:
        yield
    finally:
        handle.remove()


HeadFn = Callable[[torch.Tensor, StageInput], torch.Tensor | None]
"""Called on the last stage with ``(model output (b, R, V) at the response-predicting
positions, input)``; returns a loss to back-propagate (training) or ``None`` (forward only,
the function keeps what it needs)."""


def _run_without_stages(
    model: GPTModel, inputs: list[StageInput], head_fn: HeadFn, backward: bool
) -> None:
    """One stage holds the whole model: forward each micro-batch, then at once its backward."""
    for index in range(len(inputs)):
        loss = _stage_forward(model, inputs, index, None, head_fn)
        if backward:
            assert loss is not None, "a training head_fn must return a loss"
            loss.backward()


def run_schedule(
    model: GPTModel, inputs: list[StageInput], head_fn: HeadFn, hidden_size: int, backward: bool
) -> None:
    """Forward (and backward) every micro-batch through this stage.

    Without pipeline stages (PP=1) each micro-batch's backward runs right after its forward.
    With stages, training runs megatron's non-interleaved 1F1B order (:func:`_run_1f1b`): a
    stage holds at most ``PP - stage`` micro-batches' activations (the last stage one: its
    full-vocabulary logits), not the mini-batch's; forward-only passes stream through.
    """
    first = parallel_state.is_pipeline_first_stage()
    last = parallel_state.is_pipeline_last_stage()
    if first and last:
        _run_without_stages(model, inputs, head_fn, backward)
        return
    link = _Link(
        group=parallel_state.get_pipeline_model_parallel_group(),
        stage=parallel_state.get_pipeline_model_parallel_rank(),
        stages=parallel_state.get_pipeline_model_parallel_world_size(),
        hidden_size=hidden_size,
        dtype=next(model.parameters()).dtype,
    )
    if backward:
        _run_1f1b(model, inputs, head_fn, link)
        return
    for index in range(len(inputs)):
        output = _stage_forward(model, inputs, index, link.receive_forward(inputs[index]), head_fn)
        if not link.last:
            link.exchange(send=output, to=link.next)


@dataclass
class _Link:
    """This stage's place in the pipeline, and the point-to-point transfers with its
    neighbours (isend / irecv posted together, so two stages sending to each other at once
    cannot deadlock)."""

    group: dist.ProcessGroup
    stage: int
    stages: int
    hidden_size: int
    dtype: torch.dtype

    @property
    def last(self) -> bool:
        """Whether this is the last stage (it computes the losses)."""
        return self.stage == self.stages - 1

    @property
    def previous(self) -> int | None:
        """Global rank of the previous stage, ``None`` on the first."""
        return None if self.stage == 0 else pipeline_rank_of_stage(self.stage - 1)

    @property
    def next(self) -> int | None:
        """Global rank of the next stage, ``None`` on the last."""
        return None if self.last else pipeline_rank_of_stage(self.stage + 1)

    def hidden_like(self, item: StageInput) -> torch.Tensor:
        """An empty ``(T, b, h)`` hidden state (or its gradient) for micro-batch ``item``."""
        batch, length = item.input_ids.shape
        shape = (length, batch, self.hidden_size)
        return torch.empty(shape, dtype=self.dtype, device=item.input_ids.device)

    def exchange(
        self,
        send: torch.Tensor | None = None,
        to: int | None = None,
        receive: torch.Tensor | None = None,
        source: int | None = None,
    ) -> torch.Tensor | None:
        """Send ``send`` to ``to`` and fill ``receive`` from ``source`` (either may be
        missing); return ``receive`` once both are done."""
        ops = []
        if send is not None and to is not None:
            ops.append(dist.P2POp(dist.isend, send.detach().contiguous(), to, self.group))
        if receive is not None and source is not None:
            ops.append(dist.P2POp(dist.irecv, receive, source, self.group))
        for request in dist.batch_isend_irecv(ops) if ops else []:
            request.wait()
        return receive if source is not None else None

    def receive_forward(self, item: StageInput) -> torch.Tensor | None:
        """The previous stage's hidden state for ``item`` (``None`` on the first stage)."""
        return self.exchange(receive=self.hidden_like(item), source=self.previous)


def _stage_forward(
    model: GPTModel,
    inputs: list[StageInput],
    index: int,
    received: torch.Tensor | None,
    head_fn: HeadFn,
) -> torch.Tensor | None:
    """This stage's forward of micro-batch ``index``: its output, or on the last stage what
    ``head_fn`` returns (the loss)."""
    item = inputs[index]
    if received is not None:
        model.set_input_tensor(received)
    batch, length = item.input_ids.shape
    positions = torch.arange(length, device=item.input_ids.device).expand(batch, -1)
    last = parallel_state.is_pipeline_last_stage()
    only_responses = outputs_at(model, item.response_index) if last else nullcontext()
    with replaying(model, item.routed_experts), only_responses:  # replay (R3): see .routing
        output = model(item.input_ids, positions, _causal_mask(length, item.input_ids.device))
    return head_fn(output, item) if last else output


def _run_1f1b(model: GPTModel, inputs: list[StageInput], head_fn: HeadFn, link: _Link) -> None:
    """Training through pipeline stages in megatron's non-interleaved 1F1B order.

    Warm-up: ``PP - stage - 1`` forwards. Steady state: one forward, then the backward of
    the oldest micro-batch in flight (sending this forward's output while receiving that
    gradient, and the input gradient while receiving the next input). Cool-down: the
    backwards left. Micro-batches go through the backward in forward order.
    """
    total = len(inputs)
    warmup = min(link.stages - link.stage - 1, total)
    in_flight: deque[tuple[int, torch.Tensor | None, torch.Tensor]] = deque()

    def forward(index: int, received: torch.Tensor | None) -> torch.Tensor:
        if received is not None:
            received.requires_grad_(True)
        output = _stage_forward(model, inputs, index, received, head_fn)
        assert output is not None, "a training head_fn must return a loss"
        in_flight.append((index, received, output))
        return output

    def backward(gradient: torch.Tensor | None) -> torch.Tensor | None:
        _, received, output = in_flight.popleft()
        torch.autograd.backward(output, gradient)
        return None if received is None else received.grad

    for index in range(warmup):
        output = forward(index, link.receive_forward(inputs[index]))
        link.exchange(send=output, to=link.next)
    received = link.receive_forward(inputs[warmup]) if warmup < total else None
    for index in range(warmup, total):
        output = forward(index, received)
        oldest = inputs[in_flight[0][0]]
        gradient = link.exchange(output, link.next, link.hidden_like(oldest), link.next)
        input_gradient = backward(gradient)
        if index + 1 < total:
            following = link.hidden_like(inputs[index + 1])
            received = link.exchange(input_gradient, link.previous, following, link.previous)
        else:
            link.exchange(send=input_gradient, to=link.previous)
    while in_flight:
        oldest = inputs[in_flight[0][0]]
        gradient = link.exchange(receive=link.hidden_like(oldest), source=link.next)
        link.exchange(send=backward(gradient), to=link.previous)
