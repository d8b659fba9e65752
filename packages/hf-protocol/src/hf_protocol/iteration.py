"""Mini-batch iteration over a DataProto, for the inner epochs of a PPO-style update."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from hf_protocol.sizes import fixed_split_sizes, offsets

if TYPE_CHECKING:
    from hf_protocol.data_proto import DataProto


def iterate_mini_batches(
    data: DataProto,
    mini_batch_size: int,
    epochs: int,
    seed: int | None = None,
    shuffle: bool = False,
    drop_last: bool = False,
) -> Iterator[DataProto]:
    """Yield mini-batches of ``mini_batch_size`` rows for ``epochs`` passes over ``data``.

    With ``shuffle`` the rows are permuted anew each epoch by a generator seeded with
    ``seed``. A final smaller mini-batch is kept unless ``drop_last``.
    Arguments are checked when this is called, not at the first ``next``.
    """
    sizes = fixed_split_sizes(len(data), mini_batch_size)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    generator = torch.Generator()
    if seed is not None:
        generator.manual_seed(seed)
    bounds = [(a, b) for a, b in offsets(sizes) if not (drop_last and b - a < mini_batch_size)]
    return _mini_batches(data, bounds, epochs, generator if shuffle else None)


def _mini_batches(
    data: DataProto,
    bounds: list[tuple[int, int]],
    epochs: int,
    generator: torch.Generator | None,
) -> Iterator[DataProto]:
    for _ in range(epochs):
        if generator is None:
            yield from (data.slice(start, stop) for start, stop in bounds)
        else:
            order = torch.randperm(len(data), generator=generator)
            yield from (data.select_idxs(order[start:stop]) for start, stop in bounds)
