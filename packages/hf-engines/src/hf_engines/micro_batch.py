"""Splitting a batch into micro-batches, by row count or by a token budget.

Micro-batches keep the rows in order, so concatenating per-micro-batch results gives
the batch's order back without any bookkeeping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from tensordict import TensorDict

from hf_engines.config import AUTO_MICRO_BATCH_TOKENS, MicroBatchConfig
from hf_protocol import DataProto, fields


def split_by_size(num_rows: int, micro_batch_size: int) -> list[list[int]]:
    """Consecutive groups of ``micro_batch_size`` row indices; the last may be smaller."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 1")
    return [
        list(range(start, min(start + micro_batch_size, num_rows)))
        for start in range(0, num_rows, micro_batch_size)
    ]


def split_by_token_budget(token_counts: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Pack consecutive rows into groups whose token counts sum to at most ``max_tokens``.

    Rows are never reordered. A row longer than the budget is an error, since no split
    could hold it.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for index, count in enumerate(token_counts):
        if count > max_tokens:
            raise ValueError(
                f"row {index} has {count} tokens, more than micro_batch.max_tokens={max_tokens}; "
                f"raise max_tokens to at least the longest sequence ({max(token_counts)})"
            )
        if current and used + count > max_tokens:
            groups.append(current)
            current, used = [], 0
        current.append(index)
        used += count
    if current:
        groups.append(current)
    return groups


def batch_tensors(batch: DataProto) -> TensorDict:
    """The tensors of ``batch``; an error naming the fix if it has none."""
    if batch.batch is None:
        raise ValueError(
            "the batch holds no tensors; an engine needs input_ids, attention_mask, "
            "position_ids, responses and response_mask"
        )
    return batch.batch


def split_micro_batches(batch: DataProto, config: MicroBatchConfig) -> list[DataProto]:
    """Split ``batch`` into micro-batches as ``config`` says: by ``max_tokens``, else by
    ``micro_batch_size`` rows, else (neither set) by a budget of
    :data:`~hf_engines.config.AUTO_MICRO_BATCH_TOKENS` tokens raised to the longest row.

    The token count of a row is the sum of its ``attention_mask``.
    """
    rows = len(batch)
    if config.micro_batch_size is not None and config.max_tokens is None:
        groups = split_by_size(rows, config.micro_batch_size)
    else:
        counts = [int(c) for c in batch_tensors(batch)[fields.ATTENTION_MASK].sum(dim=-1)]
        budget = config.max_tokens
        if budget is None:
            budget = max([AUTO_MICRO_BATCH_TOKENS, *counts])
        groups = split_by_token_budget(counts, budget)
    if len(groups) == 1:
        return [batch]
    return [batch.slice(group[0], group[-1] + 1) for group in groups]


def response_counts(micro_batches: Sequence[DataProto]) -> tuple[float, float]:
    """``(response tokens, sequences)`` of ``micro_batches``; a sequence is a row with at
    least one response token (``response_mask`` ``(b, R)``)."""
    tokens = 0.0
    sequences = 0.0
    for micro in micro_batches:
        mask = batch_tensors(micro)[fields.RESPONSE_MASK]
        tokens += float(mask.sum())
        sequences += float((mask.sum(dim=-1) > 0).sum())
    return tokens, sequences


def with_totals(micro_batch: DataProto, tokens: float, sequences: float) -> DataProto:
    """``micro_batch`` with the mini-batch totals in a meta_info of its own.

    The tensors are shared; the meta_info dict is a copy, so the totals never leak into the
    caller's batch or into another micro-batch.
    """
    meta_info = {
        **micro_batch.meta_info,
        fields.MINI_BATCH_TOTALS: {"tokens": tokens, "sequences": sequences},
    }
    return DataProto(
        batch=micro_batch.batch,
        non_tensor_batch=micro_batch.non_tensor_batch,
        meta_info=meta_info,
    )


def add_metrics(sums: dict[str, float], metrics: Mapping[str, float], counted: bool) -> None:
    """Add a micro-batch's loss metrics to ``sums``; one without response tokens
    (``counted=False``, a filler) adds its names only, so every rank holds the same names."""
    for name, value in metrics.items():
        sums[name] = sums.get(name, 0.0) + (float(value) if counted else 0.0)


def global_step_metrics(
    loss: float,
    sums: dict[str, float],
    counted: int,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
) -> dict[str, float]:
    """``loss`` summed and each metric averaged over the ``counted`` micro-batches with
    tokens of every rank of ``group`` (one all-reduce; collective).

    Every rank must hold the same metric names (the same loss function on every rank).
    """
    names = sorted(sums)
    values = [loss, float(counted), *(sums[name] for name in names)]
    total = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(total, group=group)
    reduced = total.tolist()
    count = max(reduced[1], 1.0)
    result = {name: value / count for name, value in zip(names, reduced[2:], strict=True)}
    result["loss"] = reduced[0]
    return result
