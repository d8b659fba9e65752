"""The quickstart's training curves as one PNG: reward, validation accuracy, response length."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CURVES = (
    ("critic/score/mean", "mean reward (train samples)"),
    ("val/accuracy", "greedy exact-match accuracy (held out)"),
    ("response_length/mean", "mean response length (tokens)"),
)
"""(metric, panel title) for each panel, top to bottom."""
PPO_CURVES = (
    ("val/accuracy", "greedy exact-match accuracy (held out)"),
    ("critic/score/mean", "mean reward (train samples)"),
    ("critic/vf_loss", "value loss (critic)"),
    ("critic/vf_explained_var", "explained variance of the returns (critic)"),
)
"""The panels of a PPO run: accuracy and reward, and how well the critic predicts."""


def curves_for(algo: str) -> tuple[tuple[str, str], ...]:
    """The panels to draw for an RL stage ``algo`` (``ppo``: the critic's too)."""
    return PPO_CURVES if algo == "ppo" else CURVES


def series(records: Sequence[dict[str, Any]], name: str) -> tuple[list[float], list[float]]:
    """The (step, value) points of metric ``name`` in a list of metric records."""
    points = [(float(r["step"]), float(r[name])) for r in records if name in r and "step" in r]
    return [p[0] for p in points], [p[1] for p in points]


def plot_curves(
    records: Sequence[dict[str, Any]],
    path: Path,
    title: str,
    curves: Sequence[tuple[str, str]] = CURVES,
) -> Path:
    """Draw ``curves`` ((metric, title) per panel, default :data:`CURVES`) from the jsonl
    metric records of a run into ``path`` (PNG); the 0.9 line goes on the accuracy panel."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(curves), 1, figsize=(7, 2 + 2 * len(curves)), sharex=True)
    for axis, (name, label) in zip(axes, curves, strict=True):
        steps, values = series(records, name)
        axis.plot(steps, values, marker="o" if len(steps) < 30 else None, linewidth=1.2)
        axis.set_title(label, fontsize=10)
        axis.grid(alpha=0.3)
        if name == "val/accuracy":
            axis.axhline(0.9, color="gray", linestyle="--", linewidth=0.8)
    axes[-1].set_xlabel("RL step")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_seed_curves(
    curves: Mapping[int, tuple[Sequence[float], Sequence[float]]], path: Path, title: str = ""
) -> Path:
    """Held-out accuracy against GRPO step, one line per seed (``seed -> (steps, acc)``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for seed, (steps, accuracy) in curves.items():
        axis.plot(steps, accuracy, marker="o", markersize=3, linewidth=1.2, label=f"seed {seed}")
    axis.axhline(0.9, color="gray", linestyle="--", linewidth=0.8)
    axis.set_xlabel("GRPO step")
    axis.set_ylabel("greedy exact-match accuracy (held out)")
    axis.set_ylim(-0.02, 1.02)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    axis.set_title(title or "quickstart over seeds", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
