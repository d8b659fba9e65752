"""The PPO-style update loop shared by the actor and the critic: epochs of mini-batches.

``ppo_mini_batch_size`` counts rows of the *global* batch (all data-parallel ranks
together), as in verl. Each rank cuts its own shard into the same number of mini-batches,
so mini-batch ``i`` of every rank together form global mini-batch ``i``, and every rank
takes the same number of (collective) optimizer steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hf_controller import ConfigurationError
from hf_engines.config import EngineConfig
from hf_engines.engine import LossFn, TrainingEngine
from hf_protocol import DataProto


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
    """Shuffle each rank's rows before every epoch (seeded, so every run repeats)."""
    seed: int = 0
    """Seed of the shuffle; epoch ``e`` of the update call starting at optimizer step ``s``
    uses ``seed + s * 1000 + e`` (see :func:`shuffle_seed`), so resuming repeats it."""

    def __post_init__(self) -> None:
        if self.ppo_mini_batch_size < 1:
            raise ConfigurationError(f"ppo_mini_batch_size={self.ppo_mini_batch_size} must be >= 1")
        if self.ppo_epochs < 1:
            raise ConfigurationError(f"ppo_epochs={self.ppo_epochs} must be >= 1")

    def validate_for(self, dp_size: int) -> None:
        """Check the mini-batch divides over ``dp_size`` ranks and into micro-batches."""
        self.engine.micro_batch.validate_for(self.ppo_mini_batch_size, dp_size)


def count_mini_batches(global_rows: int, mini_batch_size: int) -> int:
    """Global mini-batches a batch of ``global_rows`` rows makes (the last may be short)."""
    return max(1, math.ceil(global_rows / mini_batch_size))


def split_mini_batches(
    shard: DataProto, num_mini_batches: int, permutation: torch.Tensor | None = None
) -> list[DataProto]:
    """This rank's part of each of ``num_mini_batches`` mini-batches, rows in balanced chunks.

    ``permutation`` (row indices) reorders the shard first, for shuffling.
    """
    if len(shard) < num_mini_batches:
        raise ValueError(
            f"this rank holds {len(shard)} rows, fewer than the {num_mini_batches} mini-batches "
            "every rank must step through; send a batch with at least ppo_mini_batch_size / "
            "world_size rows per rank, or lower ppo_mini_batch_size"
        )
    rows = shard if permutation is None else shard.select_idxs(permutation.numpy())
    return rows.chunk(num_mini_batches)


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
    # On the GPU under NCCL, which has no backend for CPU tensors.
    device = "cuda" if "nccl" in str(dist.get_backend()).lower() else "cpu"
    total = torch.tensor([len(shard)], dtype=torch.int64, device=device)
    dist.all_reduce(total, group=group)
    num_mini = count_mini_batches(int(total.item()), config.ppo_mini_batch_size)
    first_step = engine.global_step
    metrics: dict[str, list[float]] = {}
    for epoch in range(config.ppo_epochs):
        permutation = None
        if config.shuffle:
            seed = shuffle_seed(config.seed, first_step, epoch)
            generator = torch.Generator().manual_seed(seed)
            permutation = torch.randperm(len(shard), generator=generator)
        for mini in split_mini_batches(shard, num_mini, permutation):
            for name, value in engine.train_step(mini, loss_fn).items():
                metrics.setdefault(f"{prefix}/{name}", []).append(float(value))
    return metrics
