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
