"""The real-model recipe's curves as one PNG: held-out accuracy against training minutes,
and the training reward against the step."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

ACCURACY = (
    ("val/accuracy", "greedy"),
    ("val/sampled/accuracy", "sampled (mean@k, temperature 1)"),
)
"""The held-out accuracy lines: (metric, label)."""


def training_minutes(records: Sequence[dict[str, Any]]) -> dict[float, float]:
    """Step -> training minutes by the end of it (the sum of ``timing_s/step``; validation
    time is not training time). Step 0 (before training) is 0."""
    minutes = {0.0: 0.0}
    total = 0.0
    for record in sorted(
        (r for r in records if "timing_s/step" in r), key=lambda r: float(r["step"])
    ):
        total += float(record["timing_s/step"]) / 60
        minutes[float(record["step"])] = total
    return minutes


def plot_accuracy(records: Sequence[dict[str, Any]], path: Path) -> Path:
    """Draw held-out accuracy (greedy and sampled) against training minutes and the mean
    training reward against the step from a run's metric records into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    minutes = training_minutes(records)
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7))
    for name, label in ACCURACY:
        points = [(minutes[float(r["step"])], r[name]) for r in records if name in r]
        top.plot(*zip(*points, strict=True), marker="o", linewidth=1.2, label=label)
    top.axhline(0.6, color="gray", linestyle="--", linewidth=0.8)
    top.set_xlabel("training minutes (validation excluded)")
    top.set_ylabel("held-out accuracy")
    top.set_ylim(-0.02, 1.02)
    top.legend()
    top.grid(alpha=0.3)
    steps = [
        (float(r["step"]), r["critic/score/mean"]) for r in records if "critic/score/mean" in r
    ]
    bottom.plot(*zip(*steps, strict=True), linewidth=1.2)
    bottom.set_xlabel("GRPO step")
    bottom.set_ylabel("mean reward (train samples)")
    bottom.grid(alpha=0.3)
    figure.suptitle("GRPO on SmolLM2-135M-Instruct, chain_sum (2 CPU cores)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
