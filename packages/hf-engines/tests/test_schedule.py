"""LR schedule: warm-up, constant, cosine to the floor."""

from __future__ import annotations

import itertools

import pytest
import torch

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
