"""Learning-rate schedules: linear warm-up, then constant or half-cosine decay (pure).

These are not transformers' ``get_constant_schedule_with_warmup`` and
``get_cosine_with_min_lr_schedule_with_warmup``, which give the same learning rates from step
``warmup_steps`` to ``total_steps`` but not before or after (``test_schedule.py`` compares them
step by step):

* their warm-up is one step later: ``lr * step / warmup_steps``, so the first update runs at
  lr 0; here it is ``lr * (step + 1) / warmup_steps``, and the packaged quickstart's tuned
  runs (50 warm-up steps) were made with it;
* past ``total_steps`` their cosine turns back up (``cos`` keeps going); here it stays at
  ``min_lr_ratio * lr``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch.optim.lr_scheduler import LambdaLR


def lr_multiplier(
    step: int,
    warmup_steps: int,
    schedule: Literal["constant", "cosine"] = "constant",
    total_steps: int | None = None,
    min_lr_ratio: float = 0.0,
) -> float:
    """Factor applied to the peak learning rate at optimizer step ``step`` (0-based).

    Warm-up ramps linearly over the first ``warmup_steps`` steps, reaching 1 at step
    ``warmup_steps - 1``. The cosine schedule then decays to ``min_lr_ratio`` at
    ``total_steps`` and stays there.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"schedule={schedule!r} is not 'constant' or 'cosine'")
    if total_steps is None or total_steps <= warmup_steps:
        raise ValueError(
            f"the cosine schedule needs total_steps > warmup_steps, got "
            f"total_steps={total_steps!r}, warmup_steps={warmup_steps}; set optim.total_steps "
            "to the number of optimizer steps of the run"
        )
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    warmup_steps: int,
    schedule: Literal["constant", "cosine"] = "constant",
    total_steps: int | None = None,
    min_lr_ratio: float = 0.0,
) -> LambdaLR:
    """A ``LambdaLR`` that follows :func:`lr_multiplier`; call ``step()`` after each update."""
    lr_multiplier(0, warmup_steps, schedule, total_steps, min_lr_ratio)  # fail fast on bad args

    def factor(step: int) -> float:
        return lr_multiplier(step, warmup_steps, schedule, total_steps, min_lr_ratio)

    return LambdaLR(optimizer, factor)
