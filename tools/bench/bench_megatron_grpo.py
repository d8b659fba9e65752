"""GRPO on the real model with the actor split by Megatron, beside the 1-rank FSDP run.

SmolLM2-135M-Instruct learns reasoning-gym's chain_sum through the packaged config
``smollm2_chain_sum`` for ``--steps`` steps (no validation), once per contender, one after
another (never two at once, so they do not share the cores):

- ``fsdp``: ``backend: fsdp`` on 1 worker (the config as shipped);
- ``megatron_tp3``: ``backend: megatron`` with ``tensor_model_parallel_size=3`` on 3 workers
  (SmolLM2 has 9 heads and 3 KV heads, so 3 is the smallest TP that splits it);
- ``megatron_pp2``: ``backend: megatron`` with ``pipeline_model_parallel_size=2`` on 2 workers;
- ``fsdp_regrouped``: the FSDP run again with micro-batches of at most 512 tokens. The same
  loss in exact arithmetic, other sums in floating point: its gap to ``fsdp`` is the noise
  floor that any numerically equivalent change (a Megatron layout included) meets once
  temperature-1 sampling turns rounding into other tokens.

Every run has the same seed. Rollout samples do not depend on how many rollout workers
share a batch (each prompt row draws from its own stream), so the contenders see the same
samples as long as their weights agree; per step the table gives the loss, grad norm and
mean reward of each, their largest relative gap to ``fsdp``, and the median step seconds.

Usage (from the repository root, dev venv; a few minutes per contender on 2 cores)::

    python tools/bench/bench_megatron_grpo.py --steps 4 --contenders fsdp megatron_tp3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONTENDERS: dict[str, tuple[int, list[str]]] = {
    "fsdp": (1, []),
    "fsdp_regrouped": (1, ["actor.engine.micro_batch.max_tokens=512"]),
    "megatron_tp3": (
        3,
        ["actor.engine.backend=megatron", "actor.engine.megatron.tensor_model_parallel_size=3"],
    ),
    "megatron_pp2": (
        2,
        ["actor.engine.backend=megatron", "actor.engine.megatron.pipeline_model_parallel_size=2"],
    ),
}
"""Name -> (workers, config overrides)."""

KEYS = ("actor/loss", "actor/grad_norm", "critic/score/mean")
"""The per-step metrics compared."""


def run_contender(
    name: str, args: argparse.Namespace, work: Path, extra: list[str]
) -> list[dict[str, Any]]:
    """Train ``name`` for ``--steps`` steps (or, with ``--reuse``, read a finished run of it
    in ``work``); its ``metrics.jsonl`` rows that have a step time."""
    workers, overrides = CONTENDERS[name]
    workdir = work / name
    if not (args.reuse and sorted(workdir.rglob("metrics.jsonl"))):
        train(name, workers, [*overrides, *extra], args, workdir)
    (metrics,) = sorted(workdir.rglob("metrics.jsonl"))
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [row for row in rows if "timing_s/step" in row]


def train(
    name: str, workers: int, overrides: list[str], args: argparse.Namespace, workdir: Path
) -> None:
    """One ``hybridflow grpo`` run of the contender into ``workdir``."""
    command = [
        sys.executable,
        "-m",
        "hf_algos",
        "grpo",
        "--config-name",
        "smollm2_chain_sum",
        f"vars.workdir={workdir}",
        f"trainer.n_workers={workers}",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.seed={args.seed}",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "trainer.loggers=[jsonl]",
        *overrides,
    ]
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=sys.stderr)
    print(f"[bench] {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)


def relative_gap(value: float, reference: float) -> float:
    """``|value - reference| / max(|reference|, 1e-12)``."""
    return abs(value - reference) / max(abs(reference), 1e-12)


def table(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """A markdown table: one row per step, each contender's metrics and its gap to fsdp."""
    names = list(runs)
    header = ["step"] + [f"{name} loss / grad norm / reward" for name in names]
    header += [f"max rel. gap {name}" for name in names[1:]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    steps = min(len(rows) for rows in runs.values())
    for index in range(steps):
        cells = [str(runs[names[0]][index]["step"])]
        for name in names:
            row = runs[name][index]
            cells.append(" / ".join(f"{float(row[key]):.6g}" for key in KEYS))
        for name in names[1:]:
            gaps = [
                relative_gap(float(runs[name][index][key]), float(runs[names[0]][index][key]))
                for key in KEYS
            ]
            cells.append(f"{max(gaps):.2e}")
        lines.append("| " + " | ".join(cells) + " |")
    seconds = [
        f"{name} {statistics.median(r['timing_s/step'] for r in rows):.1f} s"
        for name, rows in runs.items()
    ]
    lines.append("")
    lines.append("Median seconds per step: " + ", ".join(seconds) + ".")
    return lines


def main(argv: list[str]) -> None:
    """Run the contenders in order and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--contenders", nargs="+", default=["fsdp", "megatron_tp3"], choices=list(CONTENDERS)
    )
    parser.add_argument("--workdir", help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--json", help="write the per-step rows here")
    parser.add_argument(
        "--megatron-override",
        action="append",
        default=[],
        help="a config override for the Megatron contenders only (repeatable), e.g. "
        "actor.engine.micro_batch.max_tokens=512 (the same loss: micro-batches only regroup "
        "the rows)",
    )
    parser.add_argument(
        "--reuse", action="store_true", help="read a contender's finished run in --workdir"
    )
    args = parser.parse_args(argv)
    if args.contenders[0] != "fsdp":
        parser.error("the first contender is the reference: start --contenders with fsdp")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.workdir or scratch)
        runs = {
            name: run_contender(
                name, args, work, args.megatron_override if name.startswith("megatron") else []
            )
            for name in args.contenders
        }
    print("\n".join(table(runs)))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
