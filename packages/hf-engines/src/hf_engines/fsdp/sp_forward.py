"""One forward pass of a micro-batch under Ulysses sequence parallelism.

The ranks of an SP group that contribute rows (the engine runs one rank's micro-batch at a
time) pack their real tokens (as ``fsdp.unpad`` does); the group concatenates the packed
rows in rank order, pads the result to a multiple of the group size, and each rank runs
the model on its ``1/sp`` slice (attention sees every token through
:func:`~hf_engines.fsdp.ulysses.ulysses_attention`). The outputs at the scored positions
are gathered back, and each rank keeps those of its own rows: the engine's inputs and
outputs per rank are the same as without sequence parallelism.

Shapes: ``N`` packed tokens of the group, ``P`` that padded to a multiple of ``sp``,
``S = P / sp`` tokens per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from hf_engines.engine import ModelOutputs
from hf_engines.fsdp.outputs import token_log_probs
from hf_engines.fsdp.ulysses import gather_shards
from hf_engines.fsdp.unpad import PackedRows, pack_rows, scatter_scored
from hf_engines.output_head import TokenScorer
from hf_protocol import fields


@dataclass(frozen=True)
class SequenceShard:
    """This rank's slice of the group's packed sequence."""

    input_ids: torch.Tensor
    """Shape ``(1, S)``."""
    position_ids: torch.Tensor
    """Shape ``(1, S)``: each sequence's own positions (RoPE needs nothing else)."""
    bounds: tuple[int, ...]
    """Where each packed sequence of the group starts in the ``P`` tokens, then ``P``."""
    local_index: torch.Tensor
    """Shape ``(k,)``: positions of the slice whose outputs some rank scores."""
    targets: torch.Tensor
    """Shape ``(1, k)``: the token each of them predicts."""
    own_index: torch.Tensor
    """Shape ``(K,)``: where this rank's own scored outputs sit in the gathered ``(P,)``."""


def _gather_varlen(local: torch.Tensor, group: ProcessGroup) -> list[torch.Tensor]:
    """Every rank's ``(C, n_r)`` tensor of the group, in rank order (``n_r`` may differ)."""
    size = dist.get_world_size(group)
    length = torch.tensor([local.shape[1]], dtype=torch.int64, device=local.device)
    lengths = [torch.empty_like(length) for _ in range(size)]
    dist.all_gather(lengths, length, group=group)
    counts = [int(n.item()) for n in lengths]
    padded = torch.nn.functional.pad(local, (0, max(counts) - local.shape[1]))
    parts = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return [part[:, :count] for part, count in zip(parts, counts, strict=True)]


def shard_sequence(packed: PackedRows, group: ProcessGroup) -> SequenceShard:
    """Concatenate the group's packed rows and cut out this rank's slice."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    ids, positions = packed.input_ids[0], packed.position_ids[0]
    predicts = torch.zeros_like(ids)
    predicts[packed.predict_index] = 1
    parts = _gather_varlen(torch.stack([ids, positions, predicts]), group)
    offset = sum(part.shape[1] for part in parts[:rank])
    tokens = torch.cat(parts, dim=1)
    pad = -tokens.shape[1] % size
    # The padding is one more sequence (positions 0..pad-1) that nothing scores.
    filler = torch.stack([torch.zeros(pad), torch.arange(pad), torch.zeros(pad)])
    tokens = torch.cat([tokens, filler.to(tokens)], dim=1)
    length = tokens.shape[1] // size
    start = rank * length
    local = tokens[:, start : start + length]
    local_index = torch.nonzero(local[2]).squeeze(-1)
    return SequenceShard(
        input_ids=local[0].unsqueeze(0),
        position_ids=local[1].unsqueeze(0),
        bounds=(*torch.nonzero(tokens[1] == 0).squeeze(-1).tolist(), tokens.shape[1]),
        local_index=local_index,
        # A scored position predicts the next packed token, a real token of its row.
        targets=tokens[0, start + local_index + 1].unsqueeze(0),
        own_index=packed.predict_index + offset,
    )


def _pack(inputs: dict[str, torch.Tensor], response_length: int, contribute: bool) -> PackedRows:
    """This rank's rows packed (``fsdp.unpad.pack_rows``), or no tokens at all."""
    ids = inputs[fields.INPUT_IDS]
    if not contribute:
        empty = ids.new_zeros(0)
        return PackedRows(empty.view(1, 0), empty.view(1, 0), empty, empty, empty)
    packed = pack_rows(
        ids,
        inputs[fields.ATTENTION_MASK],
        inputs[fields.POSITION_IDS],
        response_length,
        require_scored=False,
    )
    if packed is None:
        raise ValueError(
            "sequence parallelism packs the rows, but a row's position_ids are not "
            "0, 1, ..., L-1 over its real tokens; build position_ids from the attention mask "
            "(cumsum - 1) or set fsdp.ulysses_sequence_parallel_size=1"
        )
    return packed


def forward_sequence_parallel(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    responses: torch.Tensor,
    value_head: bool,
    temperature: float,
    group: ProcessGroup,
    contribute: bool = True,
    scorer: TokenScorer | None = None,
) -> ModelOutputs:
    """Outputs at this rank's response positions, ``(B, R)`` float32 each, as
    :func:`~hf_engines.fsdp.forward.forward_micro_batch` gives them (entropy included).

    Every rank of ``group`` calls it together. With ``contribute=False`` this rank adds no
    tokens and gets zeros, but still computes its slice of the others' tokens; back-
    propagating those zeros (times anything) keeps the group's collectives in step.
    """
    shape = (responses.shape[0], responses.shape[1])
    packed = _pack(inputs, shape[1], contribute)
    shard = shard_sequence(packed, group)
    model_inputs = {
        "input_ids": shard.input_ids,
        "position_ids": shard.position_ids,
        "use_cache": False,
        "ulysses_group": group,
        "ulysses_bounds": shard.bounds,
    }
    if value_head:
        local = model(**model_inputs).logits[0, shard.local_index, 0].float().unsqueeze(0)
        keys = ["values"]
    else:
        if scorer is not None:
            select = (slice(None), shard.local_index)
            outputs = scorer(model, model_inputs, select, shard.targets, temperature)
        else:
            logits = model(**model_inputs, logits_to_keep=shard.local_index).logits
            outputs = token_log_probs(logits, shard.targets, temperature)
        local = torch.cat([outputs["log_probs"], outputs["entropy"]])
        keys = ["log_probs", "entropy"]
    return _gather_own(local, shard, packed, keys, shape, group)


def _gather_own(
    local: torch.Tensor,
    shard: SequenceShard,
    packed: PackedRows,
    keys: list[str],
    shape: tuple[int, int],
    group: ProcessGroup,
) -> ModelOutputs:
    """Gather the ``(C, k)`` scored outputs of every slice; this rank's rows' as ``(B, R)``."""
    length = shard.input_ids.shape[1]
    spread = local.new_zeros(local.shape[0], length).index_copy(1, shard.local_index, local)
    mine = gather_shards(spread, 1, group)[:, shard.own_index]
    return {  # type: ignore[return-value]
        key: scatter_scored(mine[row], packed.rows, packed.cols, shape)
        for row, key in enumerate(keys)
    }


def zero_loss(outputs: ModelOutputs) -> torch.Tensor:
    """A zero scalar over ``outputs`` (another rank's pass): its backward takes this rank
    through the group's collectives, adding nothing to the gradients."""
    tensors = cast(dict[str, torch.Tensor], outputs)
    return torch.stack([value.sum() for value in tensors.values()]).sum() * 0.0
