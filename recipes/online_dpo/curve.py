"""Online DPO's learning curve: the held-out score over training, for a few seeds.

Runs the recipe once per seed (each with its own workdir under ``--workdir``), draws the
held-out mean score (``val/score/mean``) of every run against the step into a PNG and
prints a markdown table (score before training, at the end, and the gain) for
docs/benchmarks.md. Extra ``key=value`` arguments go to every run::

    python -m recipes.online_dpo.curve --seeds 0 1 2 --plot docs/images/online_dpo.png
    python -m recipes.online_dpo.curve --seeds 0 steps=60
    # seeds in parallel, then one plot of all:
    python -m recipes.online_dpo.curve --seeds 1 & python -m recipes.online_dpo.curve --seeds 2
    python -m recipes.online_dpo.curve --seeds 0 1 2 --replot --plot docs/images/online_dpo.png
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recipes.online_dpo.main import run

VAL_SCORE = "val/score/mean"


def held_out(history: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[float]]:
    """The (steps, held-out scores) of a run's history."""
    points = [(int(m["step"]), float(m[VAL_SCORE])) for m in history if VAL_SCORE in m]
    return [p[0] for p in points], [p[1] for p in points]


def plot_runs(histories: Mapping[int, Sequence[Mapping[str, Any]]], path: Path) -> Path:
    """Draw every seed's held-out score against the step into ``path`` (PNG); return it."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for seed, history in histories.items():
        steps, scores = held_out(history)
        axis.plot(steps, scores, marker="o", linewidth=1.2, label=f"seed {seed}")
    axis.set_xlabel("online DPO step")
    axis.set_ylabel("held-out mean score")
    axis.set_title(
        "online DPO, reverse letters, tiny Qwen2 after 90 supervised warm-up steps\n"
        "(64 held-out prompts x 4 samples; -0.5 wrong length, 1 exact)",
        fontsize=10,
    )
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def table(
    histories: Mapping[int, Sequence[Mapping[str, Any]]], seconds: Mapping[int, float]
) -> str:
    """A markdown table: per seed the held-out score before and after training, the gain."""
    lines = [
        "| seed | held-out score, step 0 | best | last step | last | gain (last - 0) | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed, history in histories.items():
        steps, scores = held_out(history)
        lines.append(
            f"| {seed} | {scores[0]:.3f} | {max(scores):.3f} | {steps[-1]} | {scores[-1]:.3f} "
            f"| {scores[-1] - scores[0]:+.3f} | {seconds[seed]:.0f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: run the seeds, write the plot, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workdir", type=Path, default=Path("outputs/online_dpo_curve"))
    parser.add_argument("--plot", type=Path, default=Path("outputs/online_dpo_curve/curve.png"))
    parser.add_argument(
        "--replot",
        action="store_true",
        help="run nothing: read each seed's history.json (e.g. of runs started in parallel)",
    )
    args, overrides = parser.parse_known_args(argv)
    histories: dict[int, list[dict[str, Any]]] = {}
    seconds: dict[int, float] = {}
    for seed in args.seeds:
        workdir = args.workdir / f"seed{seed}"
        if args.replot:
            saved = json.loads((workdir / "history.json").read_text())
            histories[seed], seconds[seed] = saved["history"], saved["seconds"]
            continue
        began = time.perf_counter()
        histories[seed] = run([f"workdir={workdir}", f"seed={seed}", *overrides])
        seconds[seed] = time.perf_counter() - began
        record = {"history": histories[seed], "seconds": seconds[seed]}
        (workdir / "history.json").write_text(json.dumps(record))
    print(f"plot: {plot_runs(histories, args.plot)}")
    print(table(histories, seconds))


if __name__ == "__main__":
    main()
