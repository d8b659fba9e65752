"""LR schedule: warm-up, constant, cosine to the floor."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Literal

import pytest
import torch
from torch.optim.lr_scheduler import LRScheduler

from hf_engines import build_lr_scheduler, lr_multiplier


def test_warmup_then_constant() -> None:
    assert [lr_multiplier(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_decays_to_the_floor() -> None:
    values = [lr_multiplier(s, 2, "cosine", total_steps=12, min_lr_ratio=0.1) for s in range(14)]
    assert values[1] == 1.0 and values[2] == 1.0
    assert values[7] == pytest.approx(0.55)
    assert values[12] == pytest.approx(0.1) and values[13] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(values[1:]))


def test_bad_schedules_fail() -> None:
    with pytest.raises(ValueError, match="total_steps > warmup_steps"):
        lr_multiplier(5, 2, "cosine")
    with pytest.raises(ValueError, match="'linear'"):
        lr_multiplier(5, 2, "linear")  # type: ignore[arg-type]


def test_scheduler_follows_the_multiplier() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    scheduler = build_lr_scheduler(optimizer, 2, "cosine", total_steps=4)
    lrs = []
    for _ in range(5):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([1.0, 2.0, 2.0, 1.0, 0.0])


def _learning_rates(
    make: Callable[[torch.optim.Optimizer], LRScheduler], steps: int
) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)
    scheduler = make(optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(float(scheduler.get_last_lr()[0]))
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("warmup", [0, 5])
@pytest.mark.parametrize(
    ("schedule", "min_lr_ratio"), [("constant", 0.0), ("cosine", 0.0), ("cosine", 0.1)]
)
def test_against_transformers_schedules(
    warmup: int, schedule: Literal["constant", "cosine"], min_lr_ratio: float
) -> None:
    """Why schedule.py keeps its own: the same learning rates as transformers' from the end of
    the warm-up to ``total_steps``, but a warm-up one step earlier and a floor after."""
    from transformers.optimization import (
        get_constant_schedule_with_warmup,
        get_cosine_with_min_lr_schedule_with_warmup,
    )

    total, steps = 20, 26  # steps 0 .. total + 5
    ours = _learning_rates(
        lambda opt: build_lr_scheduler(opt, warmup, schedule, total, min_lr_ratio), steps
    )
    if schedule == "constant":
        theirs = _learning_rates(lambda opt: get_constant_schedule_with_warmup(opt, warmup), steps)
        assert ours[warmup:] == theirs[warmup:]  # exactly, at every step after the warm-up
    else:
        theirs = _learning_rates(
            lambda opt: get_cosine_with_min_lr_schedule_with_warmup(
                opt, warmup, total, min_lr_rate=min_lr_ratio
            ),
            steps,
        )
        assert ours[warmup : total + 1] == theirs[warmup : total + 1]  # exactly
        # past total_steps: ours stays at the floor, theirs turns back up
        assert ours[total:] == [pytest.approx(3e-4 * min_lr_ratio)] * (steps - total)
        assert all(b > a for a, b in itertools.pairwise(theirs[total:]))
    # the warm-up: ours is one step ahead, theirs starts at 0
    assert ours[:warmup] == pytest.approx(theirs[1 : warmup + 1])
    if warmup:
        assert theirs[0] == 0.0 and ours[0] == pytest.approx(3e-4 / warmup)
