"""The tool_calc figure: held-out accuracy of both arms, and how often the tool arm calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recipes.quickstart.plots import series

TOOL_CALL_RATE = "multi_turn/tool_call_rate"
"""The trainer's metric: share of the step's episodes that made at least one tool call."""

ARM_LABELS = {"tool": "with the calc tool", "no_tool": "without a tool"}
"""Legend label of each arm."""


def plot_arms(
    records: Mapping[str, Sequence[dict[str, Any]]], path: Path, title: str = "tool_calc"
) -> Path:
    """Draw held-out greedy accuracy of every arm (``arm -> its GRPO metric records``) and
    the tool arm's tool-call rate into ``path`` (PNG); return ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    figure, (accuracy_axis, rate_axis) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for arm, rows in records.items():
        steps, values = series(rows, "val/accuracy")
        accuracy_axis.plot(steps, values, marker="o", linewidth=1.2, label=ARM_LABELS.get(arm, arm))
    accuracy_axis.set_title("greedy exact-match accuracy (200 held-out products)", fontsize=10)
    accuracy_axis.set_ylim(-0.02, 1.02)
    accuracy_axis.legend(fontsize=8)
    for arm, rows in records.items():
        steps, values = series(rows, TOOL_CALL_RATE)
        if steps:
            rate_axis.plot(steps, values, linewidth=1.2, label=ARM_LABELS.get(arm, arm))
    rate_axis.set_title("tool-call rate (training episodes with a calc call)", fontsize=10)
    rate_axis.set_ylim(-0.02, 1.02)
    rate_axis.set_xlabel("GRPO step")
    for axis in (accuracy_axis, rate_axis):
        axis.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
