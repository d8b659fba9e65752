"""Run the quickstart over several seeds, one after another, and tabulate held-out accuracy.

Each seed is a fresh ``python -m recipes.quickstart.main`` process whose data, model
initialisation, warm-up and GRPO sampling all derive from that seed (``task.seed``,
``sft.trainer.seed``, ``grpo.trainer.seed``). Prints a Markdown table (accuracy at every
validation, the minimum after the first GRPO step, the final value) and draws one curve per
seed::

    python -m recipes.quickstart.seeds --seeds 0 1 2 3 4 --out outputs/seeds
    python -m recipes.quickstart.seeds --seeds 0 1 2 --out outputs/seeds_deal task.name=deal_letters
    python -m recipes.quickstart.seeds --algo ppo --seeds 0 1 2 --out outputs/seeds_ppo
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from hf_algos.examples.reverse_letters import read_metrics
from hf_algos.tracking import metrics_path
from recipes.quickstart.plots import plot_seed_curves, series

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_seed(seed: int, workdir: Path, overrides: Sequence[str], algo: str = "grpo") -> float:
    """Run the quickstart with ``seed`` into ``workdir``, its RL stage ``algo`` (``grpo`` or
    ``ppo``); return its wall time in seconds."""
    command = [
        sys.executable,
        "-m",
        "recipes.quickstart.main",
        f"workdir={workdir}",
        f"task.seed={seed}",
        f"sft.trainer.seed={seed}",
        f"algo={algo}",
        f"{algo}.trainer.seed={seed}",
        "sft.trainer.progress_bar=false",
        f"{algo}.trainer.progress_bar=false",
        *overrides,
    ]
    started = time.perf_counter()
    with (workdir.parent / f"{workdir.name}.log").open("w") as log:
        subprocess.run(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - started


def accuracy_curve(workdir: Path, algo: str = "grpo") -> tuple[list[float], list[float]]:
    """(RL step, held-out accuracy) at each validation of the ``algo`` run in ``workdir``
    (its experiment is named after the algorithm, as config.yaml ships it)."""
    return series(read_metrics(metrics_path(workdir / "logs", "hybridflow", algo)), "val/accuracy")


def markdown_table(curves: Mapping[int, tuple[list[float], list[float]]]) -> str:
    """One row per seed: accuracy at each validation, min after step 0, final."""
    steps = next(iter(curves.values()))[0]
    head = ["seed", *(f"{s:.0f}" for s in steps), "min after 0", "final"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for seed, (_, accuracy) in curves.items():
        cells = [str(seed), *(f"{a:.2f}" for a in accuracy)]
        cells += [f"{min(accuracy[1:], default=accuracy[0]):.2f}", f"{accuracy[-1]:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line, run the seeds in turn, print the table, draw the plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", type=Path, default=Path("outputs/quickstart_seeds"))
    parser.add_argument("--algo", choices=("grpo", "ppo"), default="grpo", help="the RL stage")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of config.yaml")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    curves = {}
    for seed in args.seeds:
        seconds = run_seed(seed, out / f"seed{seed}", args.overrides, args.algo)
        curves[seed] = accuracy_curve(out / f"seed{seed}", args.algo)
        print(f"seed {seed}: {seconds:.0f} s, accuracy {[round(a, 2) for a in curves[seed][1]]}")
    print(markdown_table(curves))
    print(f"plot: {plot_seed_curves(curves, out / 'seeds.png', ' '.join(args.overrides))}")


if __name__ == "__main__":
    main()
