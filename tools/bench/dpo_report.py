"""Agreement checks, table and plot of ``bench_dpo.py`` (records are plain dicts:
``steps`` with per-step ``loss`` / ``chosen`` / ``rejected`` / ``margin`` / ``accuracy``,
``evals`` with held-out ``step`` / ``accuracy`` / ``margin``, ``step_seconds``)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOLERANCE = {
    "early_steps": 10,
    "early_loss_abs": 1e-4,
    "early_margin_abs": 1e-4,
    "final_accuracy_abs": 0.02,
}
"""Both columns agree when, over the first ``early_steps`` steps, every step's loss and
mean chosen-minus-rejected reward margin differ by less than the absolute bounds, and the
final held-out pair accuracies differ by at most ``final_accuracy_abs`` (64 held-out
pairs: one pair is 0.016). Later steps are reported, not bounded: float rounding of two
different code paths compounds through the optimizer."""


@dataclass
class Agreement:
    """What :func:`check_agreement` found for one loss type."""

    ok: bool
    early_loss: float = float("nan")
    early_margin: float = float("nan")
    all_loss: float = float("nan")
    all_margin: float = float("nan")
    final: tuple[float, float] = (float("nan"), float("nan"))
    problems: list[str] = field(default_factory=list)


def _max_abs(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str) -> float:
    return max((abs(x[key] - y[key]) for x, y in zip(a, b, strict=True)), default=0.0)


def check_agreement(pair: list[dict[str, Any]], target: float) -> Agreement:
    """Compare the HybridFlow record ``pair[0]`` with the TRL record ``pair[1]``."""
    ours, theirs = pair
    errors = [f"{r['name']}: {r['error']}" for r in pair if "error" in r]
    if errors:
        return Agreement(ok=False, problems=errors)
    found = Agreement(ok=True)
    if len(ours["steps"]) != len(theirs["steps"]):
        found.problems.append(f"step counts {len(ours['steps'])} vs {len(theirs['steps'])}")
        found.ok = False
        return found
    early = TOLERANCE["early_steps"]
    found.early_loss = _max_abs(ours["steps"][:early], theirs["steps"][:early], "loss")
    found.early_margin = _max_abs(ours["steps"][:early], theirs["steps"][:early], "margin")
    found.all_loss = _max_abs(ours["steps"], theirs["steps"], "loss")
    found.all_margin = _max_abs(ours["steps"], theirs["steps"], "margin")
    found.final = (ours["evals"][-1]["accuracy"], theirs["evals"][-1]["accuracy"])
    if found.early_loss >= TOLERANCE["early_loss_abs"]:
        found.problems.append(f"early loss differs by {found.early_loss:.2e}")
    if found.early_margin >= TOLERANCE["early_margin_abs"]:
        found.problems.append(f"early margin differs by {found.early_margin:.2e}")
    if abs(found.final[0] - found.final[1]) > TOLERANCE["final_accuracy_abs"]:
        found.problems.append(f"final accuracies {found.final[0]:.3f} vs {found.final[1]:.3f}")
    for record, accuracy in zip(pair, found.final, strict=True):
        if accuracy < target:
            found.problems.append(f"{record['name']} ends at {accuracy:.3f} < {target}")
    found.ok = not found.problems
    return found


def plot_curves(runs: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """PNG: per loss type, the training loss and the mean reward margin per step, both
    columns (HybridFlow solid, TRL dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, len(runs), figsize=(4.2 * len(runs), 6), squeeze=False)
    for column, (loss_type, pair) in enumerate(runs.items()):
        for record, style in zip(pair, ("-", "--"), strict=True):
            if "error" in record:
                continue
            xs = [s["step"] for s in record["steps"]]
            label = record["name"].split()[0]
            for row, key in enumerate(("loss", "margin")):
                ys = [s[key] for s in record["steps"]]
                axes[row][column].plot(xs, ys, style, linewidth=1.2, label=label)
        axes[0][column].set_title(f"loss_type={loss_type}")
        axes[0][column].set_ylabel("training loss")
        axes[1][column].set_ylabel("reward margin (chosen - rejected)")
        axes[1][column].set_xlabel("step")
        for axis in axes[:, column]:
            axis.grid(alpha=0.3)
            axis.legend()
    figure.suptitle("Offline DPO, same model / pairs / optimizer: HybridFlow vs TRL")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _evals(record: dict[str, Any]) -> str:
    return ", ".join(f"{e['step']}: {e['accuracy']:.2f}" for e in record["evals"])


def report_block(
    runs: dict[str, list[dict[str, Any]]],
    checks: dict[str, Agreement],
    settings: Any,
    loads: tuple[tuple[float, ...], tuple[float, ...]],
    plot: Path,
    target: float,
) -> str:
    """The markdown block: settings, one table row per loss type and column, the checks."""
    lines = [
        f"Run {time.strftime('%Y-%m-%d')}, 2-core 24 GiB CPU VM, load "
        f"{loads[0][0]:.1f} -> {loads[1][0]:.1f}. {settings.steps} steps of "
        f"{settings.batch} pairs, lr {settings.lr}, beta {settings.beta}, AdamW (0.9, 0.999, "
        f"1e-8), no weight decay, constant lr, clip 1.0, fp32, {settings.threads} threads. "
        f"Tolerance: {TOLERANCE}; target final held-out accuracy >= {target}.",
        "",
        "| loss | column | loss step 1 / 10 / last | margin step 10 / last "
        "| held-out accuracy (step: acc) | median s/step |",
        "|---|---|---|---|---|---|",
    ]
    for loss_type, pair in runs.items():
        for record in pair:
            if "error" in record:
                lines.append(f"| {loss_type} | {record['name']} | failed | | | |")
                continue
            steps = record["steps"]
            tenth = steps[min(9, len(steps) - 1)]
            lines.append(
                f"| {loss_type} | {record['name']} "
                f"| {steps[0]['loss']:.6f} / {tenth['loss']:.6f} / {steps[-1]['loss']:.4f} "
                f"| {tenth['margin']:.6f} / {steps[-1]['margin']:.4f} | {_evals(record)} "
                f"| {statistics.median(record['step_seconds']):.3f} |"
            )
    lines += [
        "",
        "| loss | max abs diff, first 10 steps: loss / margin | all steps: loss / "
        "margin | final accuracy HF / TRL | verdict |",
        "|---|---|---|---|---|",
    ]
    for loss_type, check in checks.items():
        verdict = "**agree**" if check.ok else "**MISSED**: " + "; ".join(check.problems)
        lines.append(
            f"| {loss_type} | {check.early_loss:.1e} / {check.early_margin:.1e} "
            f"| {check.all_loss:.1e} / {check.all_margin:.1e} "
            f"| {check.final[0]:.3f} / {check.final[1]:.3f} | {verdict} |"
        )
    lines += ["", f"![loss and margin per step]({_relative(plot)})"]
    return "\n".join(lines)


def _relative(plot: Path) -> str:
    parts = plot.resolve().parts
    return "/".join(parts[parts.index("images") :]) if "images" in parts else str(plot)
