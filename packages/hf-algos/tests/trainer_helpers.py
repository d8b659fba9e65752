"""Shared pieces of the trainer tests: tiny task files, configs, resume comparison."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from hf_algos.data import write_rows

from .toy_task import make_sort_digits_rows

NON_DETERMINISTIC = ("timing_s/", "timing_per_token_ms/", "perf/", "rollout/generate_s")
"""Wall-clock metrics: they differ between two identical runs."""


def task_files(root: Path) -> tuple[Path, Path]:
    """A small training set of the toy task (sort digits) and a held-out set.

    Scoring them needs the ``toy_task_scored`` fixture.
    """
    train = write_rows(make_sort_digits_rows(16, length=3, seed=0), root / "train.jsonl")
    val = write_rows(make_sort_digits_rows(4, length=3, seed=1), root / "val.jsonl")
    return train, val


def common_overrides(model: Path, root: Path, train: Path, steps: int) -> list[str]:
    """Batch 4 prompts x 2 samples, 6 new tokens, ``steps`` steps, logs under ``root``."""
    return [
        f"actor.engine.model.path={model}",
        f"data.train_files=[{train}]",
        "data.train_batch_size=4",
        "rollout.n=2",
        "rollout.max_new_tokens=6",
        "actor.ppo_mini_batch_size=4",
        "actor.engine.micro_batch.micro_batch_size=4",
        "actor.engine.optim.lr=1e-3",
        f"trainer.total_training_steps={steps}",
        "trainer.loggers=[jsonl]",
        "trainer.progress_bar=false",
        f"trainer.log_dir={root / 'logs'}",
        "reward.num_workers=1",
    ]


def comparable(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics that must repeat exactly in a resumed run."""
    return {k: v for k, v in metrics.items() if not k.startswith(NON_DETERMINISTIC)}


def assert_finite(history: Sequence[dict[str, float]], names: Sequence[str]) -> None:
    """Every step has ``names`` and every value is finite."""
    for step, metrics in enumerate(history, start=1):
        missing = [name for name in names if name not in metrics]
        assert not missing, f"step {step} lacks {missing}"
        bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
        assert not bad, f"step {step} has non-finite metrics {bad}"
