"""A data loader whose position (epoch, batch) is saved in checkpoints and resumed exactly.

A thin layer over torchdata's ``StatefulDataLoader``: torchdata batches the rows and saves and
restores the position within an epoch; this layer adds the epochs (a new order each epoch,
from ``seed + epoch``), the one-batch-at-a-time draw the trainers use, and the checks that a
saved position belongs to this dataset.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader as TorchdataLoader

from hf_controller import ConfigurationError
from hf_protocol import DataProto

TORCHDATA_STATE = "dataloader"
"""Key of torchdata's own loader state inside :meth:`StatefulDataLoader.state_dict`; a state
without it was written by the loader before torchdata (hf-algos <= 0.13) and is translated."""


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


class BatchSource(Protocol):
    """What a trainer draws its steps' batches from: a :class:`StatefulDataLoader` over
    files, or a :class:`~hf_algos.data.curriculum_loader.CurriculumLoader`. Its position is
    saved in checkpoints (``state_dict``), and it takes each step's scores back
    (``observe``: a curriculum may advance; rows from files ignore them)."""

    @property
    def dataset(self) -> CollatingDataset:
        """Rows of the source (the reward's set-up check scores the first)."""
        ...

    def __len__(self) -> int:
        """Batches per epoch."""
        ...

    def next_batch(self) -> DataProto:
        """The batch at the current position; the position moves past it."""
        ...

    def observe(self, scores: Sequence[float]) -> dict[str, float]:
        """One step's per-sample scores; returns metrics to log."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The position (plain data)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        ...


def _epoch_sampler(dataset: CollatingDataset, shuffle: bool, seed: int) -> DistributedSampler[int]:
    """Row indices of the epoch chosen with ``set_epoch``: a permutation from a generator
    seeded with ``seed + epoch``, or the rows in order without ``shuffle``.

    That is torch's DistributedSampler with a single replica (the driver loads all rows).
    """
    return DistributedSampler(
        dataset,  # type: ignore[arg-type]  # any sized, indexable rows
        num_replicas=1,
        rank=0,
        shuffle=shuffle,
        seed=seed,
    )


def _torchdata_loader(
    rows: Any,
    sampler: DistributedSampler[int],
    batch_size: int,
    drop_last: bool,
    collate_fn: Callable[[Sequence[Any]], Any],
) -> Any:
    """torchdata's loader over ``rows`` in ``sampler``'s order, in this process (no workers)."""
    with warnings.catch_warnings():
        # torchdata 0.11 calls torch.set_vital, which newer torch (2.13) deprecates: a
        # warning per loader that no user can act on
        warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
        return TorchdataLoader(
            rows,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=drop_last,
            collate_fn=collate_fn,
            num_workers=0,
        )


class StatefulDataLoader:
    """Batches of a dataset, reshuffled each epoch from ``seed``, with a resumable position.

    Iterating yields the remaining batches of the current epoch, then moves to the next
    epoch; ``for epoch in range(n): for batch in loader: ...`` runs ``n`` epochs.
    :meth:`state_dict` taken after a batch was handed out points at the batch after it, so
    a run restored with :meth:`load_state_dict` continues with exactly the next batch (the
    same rows, in the same order). The order of epoch ``e`` depends only on ``seed`` and
    ``e``: a permutation from a generator seeded with ``seed + e``, the same as before this
    loader ran on torchdata, so a checkpoint of either continues with the same rows.
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
        self._sampler = _epoch_sampler(dataset, shuffle, seed)
        self._loader = _torchdata_loader(
            dataset, self._sampler, batch_size, drop_last, self.collate_fn
        )
        self._batches: Iterator[DataProto] | None = None  # the current epoch's, once drawn
        self.epoch = 0
        self.batch_in_epoch = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def epoch_order(self, epoch: int) -> list[int]:
        """Row indices of ``epoch`` in the order they are served."""
        sampler = _epoch_sampler(self.dataset, self.shuffle, self.seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    def __iter__(self) -> Iterator[DataProto]:
        if len(self) == 0:
            return
        epoch = self.epoch
        while self.epoch == epoch:  # the epoch's last batch moves the position on
            yield self.next_batch()

    def next_batch(self) -> DataProto:
        """The batch at the current position, advancing the position past it (into the next
        epoch after an epoch's last batch): for a driver that draws batches one at a time,
        e.g. dynamic sampling drawing more prompts within a step."""
        if len(self) == 0:
            raise ValueError("the dataset is empty: there is no batch to draw; add data")
        if self._batches is None:
            self._batches = iter(self._loader)
        batch = next(self._batches)
        # Advance before handing the batch out, so a checkpoint taken while it is being
        # trained on resumes with the next one.
        if self.batch_in_epoch + 1 == len(self):
            self._start_epoch(self.epoch + 1)
        else:
            self.batch_in_epoch += 1
        return batch

    def observe(self, scores: Sequence[float]) -> dict[str, float]:
        """Rows read from files do not depend on the scores: nothing to do, no metrics."""
        return {}

    def _start_epoch(self, epoch: int) -> None:
        """Point at the first batch of ``epoch``."""
        self.epoch, self.batch_in_epoch = epoch, 0
        self._sampler.set_epoch(epoch)
        self._batches = None
        self._loader.load_state_dict({})  # {}: drop the finished epoch's iterator and state

    def state_dict(self) -> dict[str, Any]:
        """The position: next epoch and batch (torchdata's loader state for the batch), plus
        what must match on restore. Plain data: ints, bools, None, nested dicts."""
        return {
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "seed": self.seed,
            "num_rows": len(self.dataset),
            "batch_size": self.batch_size,
            TORCHDATA_STATE: self._loader.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict` (same dataset, batch size, seed).

        A state without torchdata's loader state (written by hf-algos <= 0.13, before this
        loader ran on torchdata) is translated: its epoch and batch give the same next batch.
        """
        expected = {"seed": self.seed, "num_rows": len(self.dataset), "batch_size": self.batch_size}
        mismatched = {k: (state.get(k), v) for k, v in expected.items() if state.get(k) != v}
        if mismatched:
            raise ValueError(
                f"loader state does not match this loader (saved, current): {mismatched}; "
                f"resume with the same dataset, batch_size and seed"
            )
        if not 0 <= state["batch_in_epoch"] < max(len(self), 1):
            raise ValueError(f"batch_in_epoch={state['batch_in_epoch']} outside [0, {len(self)})")
        self._start_epoch(int(state["epoch"]))
        self.batch_in_epoch = int(state["batch_in_epoch"])
        position = state.get(TORCHDATA_STATE)
        if position is None:
            position = self._torchdata_state_at(self.batch_in_epoch)
        self._loader.load_state_dict(position)

    def _torchdata_state_at(self, batch_in_epoch: int) -> dict[str, Any]:
        """torchdata's loader state after ``batch_in_epoch`` batches of the current epoch.

        Replays the epoch's row indices only (no row is read or collated), through a torchdata
        loader of the same sampler and batching, so the state is torchdata's own.
        """
        indices = range(len(self.dataset))
        replay = _torchdata_loader(indices, self._sampler, self.batch_size, self.drop_last, list)
        batches = iter(replay)
        for _ in range(batch_in_epoch):
            next(batches)
        state: dict[str, Any] = replay.state_dict()
        return state


def all_batches(dataset: CollatingDataset, batch_size: int) -> Iterator[DataProto]:
    """Every row of ``dataset`` once, in order, in batches of ``batch_size`` (last may be short)."""
    for start in range(0, len(dataset), batch_size):
        rows = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        yield dataset.collate(rows)


def first_row(dataset: CollatingDataset) -> DataProto:
    """``dataset``'s first row as a batch of one (what the reward set-up check scores)."""
    return dataset.collate([dataset[0]])
