"""The PPO-style update loop shared by the actor and the critic: epochs of mini-batches.

``ppo_mini_batch_size`` counts rows of the *global* batch (all data-parallel ranks
together), as in verl. Mini-batch ``i`` is the same global rows whatever the worker count:
the driver's dispatch hands rank ``r`` the contiguous, balanced slice ``[start_r, end_r)``
of the global batch (``DataProto.chunk``); the global batch is cut into contiguous,
balanced mini-batches (sizes differ by at most one, no divisor needed); rank ``r`` trains
on the intersection of its slice with each of them. A rank whose part of a mini-batch is
empty joins the step's collectives with a filler (its first rows, ``response_mask``
zeroed), which adds exactly nothing to the loss or the gradient under the engine's global
normalisers (:data:`hf_engines.engine.LossFn`). So with ``shuffle=False`` a step on N
workers equals the step on one. ``shuffle=True`` permutes each rank's own rows (the
permutation differs with the worker count, so only ``shuffle=False`` is worker-count
invariant). ``row_group_size`` keeps groups of consecutive rows (DPO pairs) whole: shards
that split a group are regrouped between the ranks, and ranges and shuffles move groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hf_controller import ConfigurationError
from hf_engines.config import EngineConfig
from hf_engines.engine import LossFn, TrainingEngine
from hf_engines.micro_batch import batch_tensors
from hf_protocol import DataProto, fields
from hf_protocol.sizes import balanced_chunk_sizes, offsets


@dataclass(frozen=True)
class UpdateConfig:
    """Fields shared by :class:`ActorConfig` and :class:`CriticConfig`."""

    engine: EngineConfig
    """The training engine (model, optimizer, FSDP layout, micro-batching)."""
    ppo_mini_batch_size: int
    """Rows per mini-batch (one optimizer step), counted over all data-parallel ranks."""
    ppo_epochs: int = 1
    """Passes over the batch per update call."""
    shuffle: bool = False
    """Shuffle each rank's rows before every epoch (seeded, so every run repeats); the
    permutation depends on the worker count, so only ``False`` gives one worker's steps."""
    seed: int = 0
    """Seed of the shuffle; epoch ``e`` of the update call starting at optimizer step ``s``
    uses ``seed + s * 1000 + e`` (see :func:`shuffle_seed`), so resuming repeats it."""
    row_group_size: int = 1
    """Consecutive rows that stay together on one rank, in one mini-batch and through a
    shuffle: 2 for DPO's (chosen, rejected) pairs. Batches must hold whole groups."""

    def __post_init__(self) -> None:
        if self.row_group_size < 1:
            raise ConfigurationError(f"row_group_size={self.row_group_size} must be >= 1")
        if self.ppo_mini_batch_size < 1:
            raise ConfigurationError(f"ppo_mini_batch_size={self.ppo_mini_batch_size} must be >= 1")
        if self.ppo_epochs < 1:
            raise ConfigurationError(f"ppo_epochs={self.ppo_epochs} must be >= 1")


def count_mini_batches(global_rows: int, mini_batch_size: int) -> int:
    """Global mini-batches a batch of ``global_rows`` rows makes (the last may be short)."""
    return max(1, math.ceil(global_rows / mini_batch_size))


FILLER_ROWS = 2
"""Rows of a filler: two, so a loss over pairs of adjacent rows (DPO) still sees a pair
(shards of row groups start on a group boundary)."""


def mini_batch_ranges(
    global_rows: int, mini_batch_size: int, row_group_size: int = 1
) -> list[tuple[int, int]]:
    """``(start, stop)`` global row ranges of the mini-batches: contiguous, balanced.

    ``ceil(global_rows / mini_batch_size)`` ranges whose sizes differ by at most one
    (7 rows, mini-batch size 4 -> ``[(0, 4), (4, 7)]``); one range when the mini-batch
    size exceeds the batch. With ``row_group_size`` ``g`` the ranges are balanced in whole
    groups of ``g`` rows (10 rows in pairs, size 4 -> ``[(0, 4), (4, 8), (8, 10)]``).
    """
    groups = _whole_groups(global_rows, row_group_size)
    count = min(count_mini_batches(global_rows, mini_batch_size), max(groups, 1))
    bounds = offsets(balanced_chunk_sizes(groups, count))
    return [(start * row_group_size, stop * row_group_size) for start, stop in bounds]


def _whole_groups(rows: int, row_group_size: int) -> int:
    if rows % row_group_size:
        raise ValueError(
            f"the batch has {rows} rows, not whole groups of row_group_size={row_group_size} "
            "(e.g. DPO pairs); send whole groups"
        )
    return rows // row_group_size


def regroup_shards(
    shard: DataProto, sizes: list[int], row_group_size: int, group: dist.ProcessGroup | None
) -> tuple[DataProto, list[int]]:
    """This rank's shard and all shard sizes, moved so that no row group straddles two
    ranks (collective when it moves rows).

    The driver's dispatch balances rows, not groups (10 rows on 3 ranks: 4/3/3 splits the
    third pair); then the ranks exchange their shards and each takes its balanced share of
    whole groups (4/4/2). Already aligned shards are returned as they are.
    """
    bounds = [sum(sizes[:r]) for r in range(len(sizes) + 1)]
    if all(bound % row_group_size == 0 for bound in bounds):
        return shard, sizes
    gathered: list[DataProto | None] = [None] * len(sizes)
    dist.all_gather_object(gathered, shard, group=group)
    whole = DataProto.concat([part for part in gathered if part is not None and len(part)])
    groups = _whole_groups(len(whole), row_group_size)
    sizes = [n * row_group_size for n in balanced_chunk_sizes(groups, len(sizes))]
    start = sum(sizes[: dist.get_rank(group)])
    return whole.slice(start, start + sizes[dist.get_rank(group)]), sizes


def group_permutation(rows: int, row_group_size: int, generator: torch.Generator) -> torch.Tensor:
    """A random order of ``rows`` row indices that moves groups of ``row_group_size``
    consecutive rows as units (``torch.randperm(rows)`` when the size is 1)."""
    order = torch.randperm(_whole_groups(rows, row_group_size), generator=generator)
    return (order.unsqueeze(1) * row_group_size + torch.arange(row_group_size)).flatten()


def filler_rows(shard: DataProto) -> DataProto:
    """The first :data:`FILLER_ROWS` rows of ``shard`` (fewer if it is shorter), copied,
    with ``response_mask`` zeroed: a micro-batch that contributes no loss and no gradient."""
    rows = shard.slice(0, FILLER_ROWS)
    tensors = batch_tensors(rows).clone()
    tensors[fields.RESPONSE_MASK] = torch.zeros_like(tensors[fields.RESPONSE_MASK])
    return DataProto(
        batch=tensors, non_tensor_batch=dict(rows.non_tensor_batch), meta_info=rows.meta_info
    )


def split_mini_batches(
    shard: DataProto,
    shard_start: int,
    ranges: list[tuple[int, int]],
    permutation: torch.Tensor | None = None,
) -> list[DataProto]:
    """This rank's part of each global mini-batch ``ranges`` (see :func:`mini_batch_ranges`).

    ``shard`` holds global rows ``[shard_start, shard_start + len(shard))``. Its part of
    mini-batch ``[a, b)`` is the intersection of the two ranges; an empty part becomes a
    :func:`filler_rows` micro-batch, so the rank still takes part in every step.
    ``permutation`` (row indices) reorders the shard first, for shuffling.
    """
    if len(shard) == 0:
        raise ValueError(
            "this rank got no rows for the update; use fewer workers than the batch has rows "
            "(trainer.n_workers <= rows per step)"
        )
    rows = shard if permutation is None else shard.select_idxs(permutation.numpy())
    shard_stop = shard_start + len(shard)
    parts = []
    for start, stop in ranges:
        low, high = max(start, shard_start), min(stop, shard_stop)
        if low < high:
            parts.append(rows.slice(low - shard_start, high - shard_start))
        else:
            parts.append(filler_rows(rows))
    return parts


def shard_sizes(rows: int, group: dist.ProcessGroup | None) -> list[int]:
    """Row counts of the shards of every rank of the data-parallel ``group``, in dp-rank
    order (collective; ``rows`` is this rank's count)."""
    # On the GPU under NCCL, which has no backend for CPU tensors.
    device = "cuda" if "nccl" in str(dist.get_backend(group)).lower() else "cpu"
    size = torch.tensor([rows], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, size, group=group)
    return [int(s.item()) for s in sizes]


def shuffle_seed(seed: int, global_step: int, epoch: int) -> int:
    """Seed of the row shuffle in ``epoch`` of the update call that starts at ``global_step``.

    Derived from the engine's optimizer step (restored by ``load_checkpoint``) rather than
    from a count of update calls, so a resumed run shuffles exactly like an uninterrupted
    one. Every call advances the step by at least ``ppo_epochs``, so no two epochs of a
    run share a seed.
    """
    return seed + global_step * 1000 + epoch


def run_update(
    engine: TrainingEngine,
    shard: DataProto,
    config: UpdateConfig,
    loss_fn: LossFn,
    prefix: str,
    group: dist.ProcessGroup | None = None,
) -> dict[str, list[float]]:
    """Train on this rank's ``shard`` for ``ppo_epochs`` epochs of mini-batches (collective).

    ``group`` holds this rank's data-parallel peers (``None``: every rank of the world is
    one); ranks of one tensor / pipeline group hold the same shard and count it once.
    Returns every metric of every step, named ``{prefix}/{name}`` (the loss function's
    metrics plus ``loss``, ``grad_norm`` and ``lr`` from the engine).
    """
    sizes = shard_sizes(len(shard), group)
    if config.row_group_size > 1:
        shard, sizes = regroup_shards(shard, sizes, config.row_group_size, group)
    if 0 in sizes:  # every rank sees it, so all of them stop instead of hanging
        raise ValueError(
            f"data-parallel rank {sizes.index(0)} got no rows for the update (shard sizes "
            f"{sizes}); send at least one row (row group) per worker: use at most "
            f"{sum(sizes) // config.row_group_size} workers (trainer.n_workers) or more rows"
        )
    start = sum(sizes[: dist.get_rank(group)])
    ranges = mini_batch_ranges(sum(sizes), config.ppo_mini_batch_size, config.row_group_size)
    first_step = engine.global_step
    metrics: dict[str, list[float]] = {}
    for epoch in range(config.ppo_epochs):
        permutation = None
        if config.shuffle:
            seed = shuffle_seed(config.seed, first_step, epoch)
            generator = torch.Generator().manual_seed(seed)
            permutation = group_permutation(len(shard), config.row_group_size, generator)
        for mini in split_mini_batches(shard, start, ranges, permutation):
            for name, value in engine.train_step(mini, loss_fn).items():
                metrics.setdefault(f"{prefix}/{name}", []).append(float(value))
    return metrics
