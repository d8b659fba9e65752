"""The report of ``bench_grpo.py``: a column's result, the summary table over seeds, the
accuracy plot and the generated markdown block."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpo_task as task

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass
class ColumnResult:
    """One column's outcome: its record, or why there is none."""

    name: str
    """Column name."""
    record: task.RunRecord | None
    """What the column measured; ``None`` when it did not run."""
    status: str
    """``ok``, or why the column is missing."""
    wall_seconds: float = 0.0
    """Wall time of the column's process, start-up and evaluations included."""
    startup_seconds: float | None = None
    """Process start to the start of the first GRPO step (HybridFlow columns)."""


def first_crossing(record: task.RunRecord, target: float) -> dict[str, float] | None:
    """The first evaluation (after the warm-up one) at or above ``target``, if any."""
    return next((e for e in record.evals[1:] if e["accuracy"] >= target), None)


def _median(values: list[float], fmt: str) -> str:
    return format(statistics.median(values), fmt) if values else "-"


def summary_table(columns: list[ColumnResult], target: float) -> str:
    """The markdown table of the benchmark: one row per column name, each number the median
    over that column's runs (one per seed); the target columns over the runs that reached it.
    """
    by_name: dict[str, list[ColumnResult]] = {}
    for column in columns:
        by_name.setdefault(column.name, []).append(column)

    def step_medians(runs: list[ColumnResult]) -> list[float]:
        return [statistics.median(r.record.step_seconds) for r in runs if r.record]

    plain = step_medians([r for r in by_name.get("plain torch loop", []) if r.record])
    plain_median = statistics.median(plain) if plain else None
    lines = [
        f"| column | runs | s/step (median) | vs plain loop | CPU s/step | start-up s | "
        f"warm-up acc | reached {target} | steps to {target} | train s to {target} | "
        f"final acc | process wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, runs in by_name.items():
        done = [r for r in runs if r.record is not None and r.record.step_seconds]
        if not done:
            cells = [name, "0", runs[0].status.splitlines()[0], *[""] * 9]
            lines.append("| " + " | ".join(cells) + " |")
            continue
        records = [r.record for r in done if r.record is not None]
        steps = step_medians(done)
        ratio = f"{statistics.median(steps) / plain_median:.2f}x" if plain_median else "-"
        cpu = [statistics.median(r.step_cpu_seconds) for r in records if r.step_cpu_seconds]
        startup = [r.startup_seconds for r in done if r.startup_seconds is not None]
        hits = [h for h in (first_crossing(r, target) for r in records) if h is not None]
        lines.append(
            f"| {name} | {len(done)} | {statistics.median(steps):.3f} | {ratio} | "
            f"{_median(cpu, '.3f')} | {_median(startup, '.1f')} | "
            f"{_median([r.warmup_accuracy for r in records], '.3f')} | "
            f"{len(hits)}/{len(records)} | {_median([h['step'] for h in hits], '.0f')} | "
            f"{_median([h['train_seconds'] for h in hits], '.1f')} | "
            f"{_median([r.evals[-1]['accuracy'] for r in records], '.3f')} | "
            f"{_median([r.wall_seconds for r in done], '.0f')} |"
        )
    return "\n".join(lines)


def plot_curves(columns: list[ColumnResult], target: float, path: Path) -> Path:
    """PNG of greedy accuracy against training seconds, one line per column."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.2))
    for column in columns:
        if column.record is None:
            continue
        xs = [e["train_seconds"] for e in column.record.evals]
        ys = [e["accuracy"] for e in column.record.evals]
        axis.plot(xs, ys, marker="o", markersize=3, label=column.name)
    axis.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target}")
    axis.set_xlabel("training seconds (evaluation excluded)")
    axis.set_ylabel("greedy exact-match accuracy (256 held-out words)")
    axis.set_title("GRPO on reverse-6-letters, 2 CPU threads")
    axis.set_ylim(0, 1)
    axis.legend(loc="lower right")
    axis.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def report_block(
    columns: list[ColumnResult],
    table: str,
    settings: Any,
    load_before: tuple[float, float, float],
    plot: Path,
    seeds: str,
) -> str:
    """The generated markdown block: machine, load, table, notes, plot."""
    from bench_support import machine_line

    load_after = os.getloadavg()
    lines = [
        f"Measured on {machine_line(['torch', 'transformers'])}; "
        f"torch threads {settings.threads}; load average (1 min) {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after the run; seeds {seeds} (each number: the median over "
        f"them); HybridFlow overrides: {' '.join(settings.hybridflow_overrides) or 'none'}. "
        f"Start-up: process start to the first GRPO step, validation before training "
        f"included.",
        "",
        table,
        "",
    ]
    for column in columns:
        if column.record is not None and column.record.notes:
            lines.append(f"- {column.name}: {column.record.notes}")
    try:
        shown = plot.resolve().relative_to((ROOT / "docs").resolve())
    except ValueError:
        shown = plot
    lines += ["", f"![accuracy against training seconds]({shown})"]
    return "\n".join(lines)
