"""A data loader whose position (epoch, batch) is saved in checkpoints and resumed exactly."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from hf_controller import ConfigurationError
from hf_protocol import DataProto


class CollatingDataset(Protocol):
    """What :class:`StatefulDataLoader` needs: indexable rows and a ``collate`` method."""

    def __len__(self) -> int:
        """Number of rows."""
        ...

    def __getitem__(self, index: int) -> Any:
        """Row ``index``."""
        ...

    def collate(self, rows: Sequence[Any]) -> DataProto:
        """A batch DataProto of ``rows``."""
        ...


class StatefulDataLoader:
    """Batches of a dataset, reshuffled each epoch from ``seed``, with a resumable position.

    Iterating yields the remaining batches of the current epoch, then moves to the next
    epoch; ``for epoch in range(n): for batch in loader: ...`` runs ``n`` epochs.
    :meth:`state_dict` taken after a batch was handed out points at the batch after it, so
    a run restored with :meth:`load_state_dict` continues with exactly the next batch (the
    same rows, in the same order). The order of epoch ``e`` depends only on ``seed`` and
    ``e``.
    """

    def __init__(
        self,
        dataset: CollatingDataset,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        collate_fn: Callable[[Sequence[Any]], DataProto] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and len(dataset) < batch_size:  # a user error: the CLI exits 2
            raise ConfigurationError(
                f"the dataset has {len(dataset)} rows, fewer than batch_size={batch_size} "
                f"(data.train_batch_size), so drop_last=True leaves no batch; lower the batch "
                "size or add data"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.collate_fn = collate_fn or dataset.collate
        self.epoch = 0
        self.batch_in_epoch = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def epoch_order(self, epoch: int) -> list[int]:
        """Row indices of ``epoch`` in the order they are served."""
        if not self.shuffle:
            return list(range(len(self.dataset)))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def __iter__(self) -> Iterator[DataProto]:
        epoch, start = self.epoch, self.batch_in_epoch
        order = self.epoch_order(epoch)
        for batch_index in range(start, len(self)):
            indices = order[batch_index * self.batch_size : (batch_index + 1) * self.batch_size]
            batch = self.collate_fn([self.dataset[i] for i in indices])
            # Advance before handing the batch out, so a checkpoint taken while it is being
            # trained on resumes with the next one.
            if batch_index + 1 == len(self):
                self.epoch, self.batch_in_epoch = epoch + 1, 0
            else:
                self.batch_in_epoch = batch_index + 1
            yield batch

    def next_batch(self) -> DataProto:
        """The batch at the current position, advancing the position past it (into the next
        epoch after an epoch's last batch): for a driver that draws batches one at a time,
        e.g. dynamic sampling drawing more prompts within a step."""
        if len(self) == 0:
            raise ValueError("the dataset is empty: there is no batch to draw; add data")
        return next(iter(self))

    def state_dict(self) -> dict[str, int]:
        """The position: next epoch and batch, plus what must match on restore."""
        return {
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "seed": self.seed,
            "num_rows": len(self.dataset),
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore a position saved by :meth:`state_dict` (same dataset, batch size, seed)."""
        expected = {"seed": self.seed, "num_rows": len(self.dataset), "batch_size": self.batch_size}
        mismatched = {k: (state.get(k), v) for k, v in expected.items() if state.get(k) != v}
        if mismatched:
            raise ValueError(
                f"loader state does not match this loader (saved, current): {mismatched}; "
                f"resume with the same dataset, batch_size and seed"
            )
        if not 0 <= state["batch_in_epoch"] < max(len(self), 1):
            raise ValueError(f"batch_in_epoch={state['batch_in_epoch']} outside [0, {len(self)})")
        self.epoch = int(state["epoch"])
        self.batch_in_epoch = int(state["batch_in_epoch"])
