"""Group statistics of per-sequence scores, groups given by an id per row (``uid``)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch


def group_ids(index: Sequence[Hashable] | np.ndarray[Any, Any] | torch.Tensor) -> torch.Tensor:
    """Dense group numbers ``0..G-1`` for row labels (first appearance order), ``(B,)`` int64."""
    if isinstance(index, torch.Tensor):
        index = index.tolist()
    numbers: dict[Hashable, int] = {}
    return torch.tensor([numbers.setdefault(label, len(numbers)) for label in index])


def group_mean_std(
    scores: torch.Tensor, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row mean, unbiased std and size of the row's group.

    Shape: ``scores`` and ``ids`` ``(B,)``; returns three ``(B,)`` tensors. A group of one
    has mean 0 and std 1 (nothing to compare with, so the score passes through).
    """
    if scores.shape != ids.shape:
        raise ValueError(
            f"{len(ids)} group ids for {len(scores)} scores; give one uid per response row"
        )
    ids = ids.to(scores.device)
    groups = int(ids.max()) + 1 if len(ids) else 0
    sizes = torch.bincount(ids, minlength=groups).to(scores.dtype)
    sums = torch.zeros(groups, dtype=scores.dtype).index_add_(0, ids, scores)
    means = sums / sizes
    squares = torch.zeros(groups, dtype=scores.dtype).index_add_(0, ids, (scores - means[ids]) ** 2)
    stds = torch.sqrt(squares / (sizes - 1).clamp(min=1.0))
    single = sizes[ids] < 2
    mean = torch.where(single, torch.zeros_like(scores), means[ids])
    std = torch.where(single, torch.ones_like(scores), stds[ids])
    return mean, std, sizes[ids]


def varied_group_rows(ids: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Rows whose group's values are not all the same (DAPO dynamic sampling keeps these).

    A group whose samples all score alike has zero advantage under group baselines, so it
    teaches nothing; a group of one sample is kept (nothing to compare it with; verl does
    the same).

    Shape: ``ids`` (dense group numbers, :func:`group_ids`) and ``values`` ``(B,)``; returns a
    ``(B,)`` bool mask.
    """
    if values.shape != ids.shape:
        raise ValueError(
            f"{len(ids)} group ids for {len(values)} values; give one uid per response row"
        )
    if len(ids) == 0:
        return torch.zeros(0, dtype=torch.bool)
    groups = int(ids.max()) + 1
    values = values.to(torch.float64)
    inf = torch.full((groups,), float("inf"), dtype=torch.float64)
    lowest = inf.scatter_reduce(0, ids, values, reduce="amin")
    highest = (-inf).scatter_reduce(0, ids, values, reduce="amax")
    sizes = torch.bincount(ids, minlength=groups)
    varied = (highest > lowest) | (sizes < 2)
    return varied[ids]


def first_groups_rows(ids: torch.Tensor, count: int) -> torch.Tensor:
    """Rows of the first ``count`` groups, by first appearance (trims a batch to ``count``
    prompt groups).

    Shape: ``ids`` ``(B,)`` row labels as integers (any values, e.g. :func:`group_ids`);
    returns a ``(B,)`` bool mask.
    """
    if count < 0:
        raise ValueError(f"count={count} groups must be >= 0")
    dense = group_ids(ids)
    return dense < count if len(dense) else torch.zeros(0, dtype=torch.bool)
