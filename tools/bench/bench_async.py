"""Throughput of the async modes against the synchronous loop, on a generation-heavy workload.

Each column runs ``hybridflow grpo --config-name quickstart`` (the packaged config, its
random-weight tiny Qwen2) in its own process with responses long enough that generation
and the update take about the same time, and reports samples per second: rows of a step
(prompts x ``rollout.n``) over the step's wall time (``timing_s/step``, which in the async
modes includes the time the trainer waited for generated data). The first steps (process
warm-up, the queue filling) are left out; a column's figure is the median step of the kept
steps, and the table shows the median over repeats. Repeats go round-robin over the
columns, so drift in the machine's load reaches every column alike.

Columns (same model, prompts, batch, response length, optimizer):

* ``off (hybrid)``: today's default, rollout and actor in one process, the sampler's own
  log-probs (one update per step, so old log-probs equal them);
* ``off (separate)``: the synchronous loop with the rollout on its own process;
* ``one_step_off``, ``fully_async``, ``fully_async + partial``: separate placement, the
  trainer recomputes old log-probs (the samples are off-policy) and TIS weighs them.

Usage (from the repository root, dev venv):

    python tools/bench/bench_async.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

ASYNC = [
    "trainer.placement=separate",
    "actor.use_rollout_log_probs=false",
    "algorithm.rollout_correction.mode=tis",
]
COLUMNS: dict[str, list[str]] = {
    "off (hybrid)": ["trainer.placement=hybrid", "trainer.async_mode=off"],
    "off (separate)": ["trainer.placement=separate", "trainer.async_mode=off"],
    "one_step_off": [*ASYNC, "trainer.async_mode=one_step_off"],
    "fully_async": [*ASYNC, "trainer.async_mode=fully_async", "trainer.queue_size=2"],
    "fully_async + partial": [
        *ASYNC,
        "trainer.async_mode=fully_async",
        "trainer.queue_size=2",
        "rollout.partial=true",
        "rollout.partial_chunk_tokens=32",
    ],
}
"""Column name -> its overrides of the packaged quickstart config."""


@dataclass
class Column:
    """One contender and what its repeats measured."""

    name: str
    overrides: list[str]
    samples_per_s: list[float] = field(default_factory=list)
    """Per repeat: the median over the kept steps."""
    gen_s: list[float] = field(default_factory=list)
    update_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    """Per repeat: the process's wall time, start-up included."""


def run_column(column: Column, args: argparse.Namespace, workdir: Path, repeat: int) -> None:
    """One repeat of ``column`` in a fresh ``hybridflow`` process; appends its figures."""
    log_dir = workdir / "logs" / column.name.replace(" ", "_").replace("+", "p") / str(repeat)
    command = [
        sys.executable,
        "-m",
        "hf_algos",
        "grpo",
        "--config-name",
        "quickstart",
        f"vars.workdir={workdir / 'shared'}",
        f"trainer.log_dir={log_dir}",
        f"trainer.checkpoint_dir={log_dir / 'checkpoints'}",
        "trainer.export_dir=null",
        f"trainer.total_training_steps={args.steps}",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "trainer.val_before_train=false",
        "trainer.loggers=[jsonl]",
        "trainer.progress_bar=false",
        f"trainer.seed={repeat}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"rollout.n={args.n}",
        f"data.train_batch_size={args.batch}",
        f"actor.ppo_mini_batch_size={args.batch * args.n}",  # one update per step
        f"actor.engine.micro_batch.micro_batch_size={args.batch * args.n}",
        *column.overrides,
    ]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (log_dir / "process.log").parent.mkdir(parents=True, exist_ok=True)
    (log_dir / "process.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise RuntimeError(f"{column.name} (repeat {repeat}) failed:\n{tail}")
    rows = [json.loads(line) for path in log_dir.rglob("metrics.jsonl") for line in path.open()]
    steps = [r for r in rows if "timing_s/step" in r][args.skip :]
    if not steps:
        raise RuntimeError(f"{column.name}: no step after the first {args.skip} in {log_dir}")
    rows_per_step = args.batch * args.n
    rates = [rows_per_step / r["timing_s/step"] for r in steps]
    column.samples_per_s.append(statistics.median(rates))
    column.gen_s.append(statistics.median(r.get("timing_s/gen", 0.0) for r in steps))
    column.update_s.append(statistics.median(r.get("timing_s/update_actor", 0.0) for r in steps))
    column.wall_s.append(wall)
    print(
        f"{column.name:>24} repeat {repeat}: {column.samples_per_s[-1]:6.1f} samples/s "
        f"(gen/wait {column.gen_s[-1]:.2f} s, update {column.update_s[-1]:.2f} s, "
        f"process {wall:.0f} s)",
        flush=True,
    )


def table(columns: list[Column]) -> str:
    """The markdown table: medians over repeats, and the ratio to ``off (hybrid)``."""
    base = statistics.median(columns[0].samples_per_s)
    lines = [
        "| column | samples/s (median) | vs off (hybrid) | per repeat | gen or wait s/step | "
        "update_actor s/step | process wall s |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for c in columns:
        rate = statistics.median(c.samples_per_s)
        per = ", ".join(f"{v:.1f}" for v in c.samples_per_s)
        lines.append(
            f"| {c.name} | {rate:.1f} | {rate / base:.2f}x | {per} | "
            f"{statistics.median(c.gen_s):.2f} | {statistics.median(c.update_s):.2f} | "
            f"{statistics.median(c.wall_s):.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every column ``--repeats`` times, print the table, optionally write the docs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps per process")
    parser.add_argument("--skip", type=int, default=3, help="first steps left out")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16, help="data.train_batch_size")
    parser.add_argument("--n", type=int, default=8, help="rollout.n")
    parser.add_argument("--columns", default=",".join(COLUMNS), help="comma-separated names")
    parser.add_argument("--output", type=Path, help="write the block into this markdown file")
    parser.add_argument("--section", default="async", help="marker key of the block in --output")
    args = parser.parse_args(argv)
    columns = [Column(name, COLUMNS[name]) for name in args.columns.split(",")]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        for repeat in range(args.repeats):
            for column in columns:
                run_column(column, args, Path(tmp), repeat)
    result = table(columns)
    print(result)
    if args.output is not None:
        sys.path.insert(0, str(HERE))
        from bench_support import machine_line, write_section

        command = "python tools/bench/bench_async.py " + shlex.join(argv or sys.argv[1:])
        body = "\n".join(
            [
                f"`{command}`; measured on {machine_line(['torch', 'ray'])}; "
                f"load average (1 min) {load_before[0]:.1f} before, "
                f"{os.getloadavg()[0]:.1f} after. {args.batch} prompts x {args.n} samples per "
                f"step, up to {args.max_new_tokens} new tokens (the random-weight model "
                f"rarely stops early); steps 1-{args.skip} left out; {args.repeats} repeats.",
                "",
                result,
            ]
        )
        write_section(args.output, args.section, "## Async modes: throughput", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
