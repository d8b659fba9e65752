"""The learning curve of one ``hybridflow`` run, from its ``metrics.jsonl``.

Reads the run's metrics log (the ``jsonl`` logger's ``<log_dir>/metrics.jsonl``), puts
every step's validation metrics against the training seconds so far (the sum of
``timing_s/step``: generation, scoring and update, not validation or start-up), and writes
a markdown table and, with ``--plot``, a PNG of the curves.

Usage (repository root, dev venv)::

    python tools/bench/run_curve.py outputs/gemma3_chain_sum/logs/metrics.jsonl \\
        --plot docs/images/gemma3_chain_sum.png --title "Gemma 3 270M, chain_sum"
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_METRICS = ("val/accuracy", "val/sampled/accuracy")
STEP_SECONDS = "timing_s/step"


@dataclass(frozen=True)
class Point:
    """One validation of a run: its step, the training seconds before it, its values."""

    step: int
    seconds: float
    values: dict[str, float]


def read_records(path: Path) -> list[dict[str, float]]:
    """The JSON lines of a metrics log, in order; an error naming the line if one is bad."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number} is not a JSON line: {error}") from error
    return records


def curve(records: list[dict[str, float]], metrics: tuple[str, ...]) -> list[Point]:
    """The points where any of ``metrics`` was logged, with the training seconds so far.

    A step's ``timing_s/step`` counts towards that step's own validation: the trainer
    validates after the step. A validation before the first step (``val_before_train``)
    is at 0 seconds. Several lines of one step (a resumed run) are merged.
    """
    merged: dict[int, dict[str, float]] = {}
    for record in records:
        step = int(record["step"])
        merged.setdefault(step, {}).update(
            {key: value for key, value in record.items() if value is not None}
        )
    points: list[Point] = []
    seconds = 0.0
    for step in sorted(merged):
        record = merged[step]
        seconds += float(record.get(STEP_SECONDS, 0.0))
        values = {name: float(record[name]) for name in metrics if name in record}
        if values:
            points.append(Point(step, seconds, values))
    if not points:
        raise ValueError(f"no line holds any of {list(metrics)}: is validation on (test_freq)?")
    return points


def table(points: list[Point], metrics: tuple[str, ...]) -> str:
    """A markdown table: step, training minutes, one column per metric."""
    lines = [
        "| step | training minutes | " + " | ".join(f"`{name}`" for name in metrics) + " |",
        "|---:|---:|" + "---:|" * len(metrics),
    ]
    for point in points:
        cells = [f"{point.values[name]:.3f}" if name in point.values else "-" for name in metrics]
        lines.append(f"| {point.step} | {point.seconds / 60:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(points: list[Point], metrics: tuple[str, ...], title: str, path: Path) -> Path:
    """Each metric against training minutes, as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    for name in metrics:
        shown = [point for point in points if name in point.values]
        axes.plot(
            [p.seconds / 60 for p in shown], [p.values[name] for p in shown], "o-", label=name
        )
    axes.set_xlabel("training minutes (sum of timing_s/step)")
    axes.set_ylabel("held-out accuracy")
    axes.set_ylim(0, 1)
    axes.grid(alpha=0.3)
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> int:
    """Print the table of a run's curve; write its plot with ``--plot``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="the run's metrics.jsonl")
    parser.add_argument("--metric", action="append", help="repeatable; default: val accuracy")
    parser.add_argument("--plot", type=Path, help="write a PNG here")
    parser.add_argument("--title", default="", help="the plot's title")
    args = parser.parse_args(argv)
    metrics = tuple(args.metric) if args.metric else DEFAULT_METRICS
    points = curve(read_records(args.log), metrics)
    print(table(points, metrics))
    if args.plot:
        print(f"plot: {plot(points, metrics, args.title, args.plot)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
