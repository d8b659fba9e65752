"""GRPO on the quickstart task, side by side: HybridFlow vs TRL's GRPOTrainer vs a plain
single-process torch loop, on this CPU.

One run does, in order (never two columns at once, so they do not share the cores):

1. the warm-up: ``grpo_plain_loop.py --warmup-only`` builds the tiny Qwen2 + tokenizer and
   runs the 90-step SFT; every column starts GRPO from that one folder;
2. each column in its own process: the plain loop (dev venv), TRL (``.venv-trl``, see
   ``setup_trl_venv.sh``) and HybridFlow (:func:`run_hybridflow`, the quickstart recipe's
   GRPO stage), each writing a :class:`grpo_task.RunRecord`;
3. a table (seconds per step, steps and training seconds to the target accuracy), a PNG of
   accuracy against training seconds, and, with ``--output``, the generated block of
   ``docs/benchmarks.md``.

Same prompts in the same order, same validation set and evaluator, same model, group size,
batch, generation length, temperature, clip, lr and optimizer settings in every column.

Usage (from the repository root, dev venv):

    bash tools/bench/setup_trl_venv.sh
    python tools/bench/bench_grpo.py --output docs/benchmarks.md
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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
import grpo_task as task  # noqa: E402

DEFAULT_TRL_PYTHON = HERE / ".venv-trl" / "bin" / "python"
DEFAULT_PLOT = ROOT / "docs" / "images" / "bench_grpo.png"


@dataclass
class BenchSettings:
    """What every column is asked to do."""

    max_steps: int = 1000
    """Upper bound on GRPO steps per column."""
    eval_every: int = 25
    """Steps between greedy evaluations."""
    target: float = 0.9
    """Exact-match accuracy whose first crossing is timed."""
    stop_at_target: bool = True
    """Stop a column at its first evaluation at or above the target."""
    threads: int = 2
    """``torch.set_num_threads`` in every column."""
    seed: int = 2
    """Seed of the GRPO prompts (and sampling where a column takes one)."""
    hybridflow_steps: int = 300
    """Steps of the HybridFlow column, which cannot stop at the target (the recipe has no
    such switch) and so always runs this many."""


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


COLUMN_TIMEOUT_S = 1800.0
"""Longest a column's process may run before it is killed and reported as failed."""


def column_env(threads: int) -> dict[str, str]:
    """Environment of every column's process.

    ``OMP_NUM_THREADS`` is ``threads`` so that processes a column starts (HybridFlow's Ray
    workers, where Ray would otherwise set 1) use as many torch threads as the others.
    ``OMP_WAIT_POLICY=PASSIVE`` (unless already set): with the default spinning waits, two
    torch threads on a shared 2-core machine made a GRPO step take 8-27 s instead of 0.3 s.
    """
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }


def run_process(
    name: str, command: list[str], result: Path, log: Path, threads: int
) -> ColumnResult:
    """Run one column's process; read the record it writes to ``result``."""
    started = time.perf_counter()
    print(f"[{name}] {' '.join(command)}", flush=True)
    try:
        with log.open("w") as handle:
            proc = subprocess.run(
                command,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=column_env(threads),
                cwd=ROOT,
                timeout=COLUMN_TIMEOUT_S,
            )
    except subprocess.TimeoutExpired:
        return ColumnResult(name, None, f"timed out after {COLUMN_TIMEOUT_S:.0f}s; log {log}")
    wall = time.perf_counter() - started
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-2000:]
        return ColumnResult(
            name, None, f"failed (exit {proc.returncode}); log {log}:\n{tail}", wall
        )
    return ColumnResult(name, task.RunRecord(**json.loads(result.read_text())), "ok", wall)


def column_args(settings: BenchSettings) -> list[str]:
    """The command-line flags both baseline scripts share."""
    flags = [
        f"--max-steps={settings.max_steps}",
        f"--eval-every={settings.eval_every}",
        f"--threads={settings.threads}",
        f"--seed={settings.seed}",
    ]
    return flags if settings.stop_at_target else [*flags, "--no-stop"]


def run_plain(warm: Path, settings: BenchSettings, workdir: Path) -> ColumnResult:
    """The plain single-process torch loop (dev venv)."""
    result = workdir / "plain.json"
    script = str(HERE / "grpo_plain_loop.py")
    command = [sys.executable, script, f"--init={warm}", f"--result={result}"]
    return run_process(
        "plain torch loop",
        command + column_args(settings),
        result,
        workdir / "plain.log",
        settings.threads,
    )


def run_trl(warm: Path, settings: BenchSettings, workdir: Path, python: Path) -> ColumnResult:
    """TRL's GRPOTrainer, in the TRL venv's interpreter ``python``."""
    if not python.exists():
        return ColumnResult(
            "TRL GRPOTrainer", None, f"skipped: {python} missing; run tools/bench/setup_trl_venv.sh"
        )
    result = workdir / "trl.json"
    command = [str(python), str(HERE / "grpo_trl.py"), f"--init={warm}", f"--result={result}"]
    return run_process(
        "TRL GRPOTrainer",
        command + column_args(settings),
        result,
        workdir / "trl.log",
        settings.threads,
    )


def run_hybridflow(warm: Path, settings: BenchSettings, workdir: Path) -> ColumnResult:
    """HybridFlow: the quickstart recipe's GRPO stage from ``warm``, in its own process.

    The child (this script's ``hybridflow-column`` mode, :func:`hybridflow_column`) imports
    ``recipes.quickstart``; when that recipe or the trainer it uses is not importable yet,
    the column is reported as not available.
    """
    name = "HybridFlow"
    probe = subprocess.run(
        [sys.executable, "-c", "import recipes.quickstart.main"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        why = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "import failed"
        return ColumnResult(name, None, f"not available yet ({why})")
    result = workdir / "hybridflow.json"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "hybridflow-column",
        f"--init={warm}",
        f"--result={result}",
        f"--workdir={workdir / 'hybridflow'}",
        *column_args(replace(settings, max_steps=settings.hybridflow_steps)),
    ]
    return run_process(name, command, result, workdir / "hybridflow.log", settings.threads)


def hybridflow_column(argv: list[str]) -> int:
    """Child process of :func:`run_hybridflow`: quickstart GRPO stage -> RunRecord JSON.

    The recipe's own config, with the benchmark's prompts (in order, no shuffling), its
    validation set, ``eval_every`` and step budget. The recipe has no stop-at-target, so it
    runs ``--max-steps`` steps; step time is the trainer's ``timing_s/step``.
    """
    parser = argparse.ArgumentParser()
    for flag in ("--init", "--result", "--workdir"):
        parser.add_argument(flag, type=Path, required=True)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--eval-every", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--no-stop", action="store_true")
    args = parser.parse_args(argv)

    import torch

    from hf_algos.data import write_rows
    from hf_algos.examples.reverse_letters import make_reverse_letters_rows, read_metrics
    from recipes.quickstart.main import (
        CONFIG_PATH,
        grpo_config,
        load_recipe_config,
        run_grpo,
        run_metrics_path,
    )

    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    data = args.workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    files = {"train": data / "train.jsonl", "val": data / "val.jsonl"}
    prompts = 16 * args.max_steps
    write_rows(make_reverse_letters_rows(prompts, task.WORD_LENGTH, seed=args.seed), files["train"])
    val = task.validation_rows()
    val_rows = make_reverse_letters_rows(len(val), task.WORD_LENGTH, seed=task.VALIDATION_SEED)
    write_rows(val_rows, files["val"])
    raw = load_recipe_config(
        CONFIG_PATH,
        [
            f"grpo.trainer.total_training_steps={args.max_steps}",
            f"grpo.trainer.test_freq={args.eval_every}",
            "grpo.trainer.progress_bar=false",
            "grpo.data.shuffle=false",
            # the other columns' sampling and optimizer (the recipe ships 16 samples at 0.7
            # and an lr warm-up)
            "grpo.rollout.temperature=1.0",
            "grpo.rollout.n=8",
            "grpo.actor.ppo_mini_batch_size=128",
            "grpo.actor.engine.micro_batch.micro_batch_size=128",
            "grpo.actor.engine.optim.warmup_steps=0",
            # the benchmark tokenizer puts <bos> in front: 6 letters, "=" and <bos>
            f"grpo.data.max_prompt_length={task.PROMPT_LENGTH}",
        ],
    )
    config = grpo_config(raw, args.workdir, args.init, files)
    run_grpo(config, args.workdir / "model_grpo")
    records = read_metrics(run_metrics_path(config))
    args.result.write_text(json.dumps(asdict(record_from_metrics(records, args.threads))))
    return 0


def record_from_metrics(records: list[dict[str, Any]], threads: int) -> task.RunRecord:
    """A RunRecord from the trainer's jsonl metrics (``timing_s/step``, ``val/accuracy``)."""
    record = task.RunRecord(name="HybridFlow", notes=f"quickstart recipe config; threads {threads}")
    seconds_at: dict[int, float] = {0: 0.0}
    total = 0.0
    for row in records:
        if "timing_s/step" in row:
            total += float(row["timing_s/step"])
            record.step_seconds.append(float(row["timing_s/step"]))
            seconds_at[int(row["step"])] = total
    for row in records:
        if "val/accuracy" in row:  # validation before training is logged at step 0
            step = int(row["step"])
            record.evals.append(
                {
                    "step": step,
                    "train_seconds": seconds_at.get(step, total),
                    "accuracy": float(row["val/accuracy"]),
                }
            )
    if record.evals:
        record.warmup_accuracy = record.evals[0]["accuracy"]
    return record


def first_crossing(record: task.RunRecord, target: float) -> dict[str, float] | None:
    """The first evaluation (after the warm-up one) at or above ``target``, if any."""
    return next((e for e in record.evals[1:] if e["accuracy"] >= target), None)


def summary_table(columns: list[ColumnResult], target: float) -> str:
    """The markdown table of the benchmark."""
    plain = next((c for c in columns if c.name == "plain torch loop" and c.record), None)
    plain_median = statistics.median(plain.record.step_seconds) if plain and plain.record else None
    lines = [
        f"| column | s/step (median) | s/step (mean) | vs plain loop | CPU s/step (median) | "
        f"warm-up acc | steps to {target} | train s to {target} | final acc | process wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for column in columns:
        record = column.record
        if record is None or not record.step_seconds:
            lines.append(f"| {column.name} | {column.status.splitlines()[0]} ||||||||| ")
            continue
        median = statistics.median(record.step_seconds)
        mean = statistics.fmean(record.step_seconds)
        ratio = f"{median / plain_median:.2f}x" if plain_median else "-"
        cpu = record.step_cpu_seconds
        cpu_median = f"{statistics.median(cpu):.3f}" if cpu else "-"
        hit = first_crossing(record, target)
        steps = f"{hit['step']:.0f}" if hit else f"not in {len(record.step_seconds)}"
        seconds = f"{hit['train_seconds']:.1f}" if hit else "-"
        lines.append(
            f"| {column.name} | {median:.3f} | {mean:.3f} | {ratio} | {cpu_median} | "
            f"{record.warmup_accuracy:.3f} | {steps} | {seconds} | "
            f"{record.evals[-1]['accuracy']:.3f} | {column.wall_seconds:.0f} |"
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


def main(argv: list[str] | None = None) -> int:
    """Command line: run the warm-up and every column, print and write the results."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "hybridflow-column":
        return hybridflow_column(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--columns", default="plain,trl,hybridflow", help="comma-separated")
    parser.add_argument("--trl-python", type=Path, default=DEFAULT_TRL_PYTHON)
    parser.add_argument("--workdir", type=Path, help="keep logs and records here")
    parser.add_argument("--init", type=Path, help="reuse this warmed-up folder (skip warm-up)")
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT)
    parser.add_argument("--output", type=Path, help="write the block into this markdown file")
    parser.add_argument("--max-steps", type=int, default=BenchSettings.max_steps)
    parser.add_argument("--eval-every", type=int, default=BenchSettings.eval_every)
    parser.add_argument("--threads", type=int, default=BenchSettings.threads)
    parser.add_argument("--no-stop", action="store_true", help="run all --max-steps")
    parser.add_argument("--hybridflow-steps", type=int, default=BenchSettings.hybridflow_steps)
    args = parser.parse_args(argv)
    settings = BenchSettings(
        hybridflow_steps=args.hybridflow_steps,
        max_steps=args.max_steps,
        eval_every=args.eval_every,
        threads=args.threads,
        stop_at_target=not args.no_stop,
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    warm = args.init or prepare_warm_start(workdir, settings)
    runners = {
        "plain": lambda: run_plain(warm, settings, workdir),
        "trl": lambda: run_trl(warm, settings, workdir, args.trl_python),
        "hybridflow": lambda: run_hybridflow(warm, settings, workdir),
    }
    unknown = set(args.columns.split(",")) - set(runners)
    if unknown:
        raise SystemExit(f"unknown --columns {sorted(unknown)}; choose from {sorted(runners)}")
    columns = [runners[name]() for name in args.columns.split(",")]
    table = summary_table(columns, settings.target)
    plot = plot_curves(columns, settings.target, args.plot)
    body = report_block(columns, table, settings, load_before, plot)
    print("\n" + body)
    (workdir / "columns.json").write_text(
        json.dumps([{**asdict(c), "record": c.record and asdict(c.record)} for c in columns])
    )
    if args.output is not None:
        from bench_support import write_section

        write_section(args.output, "grpo", "## GRPO on the quickstart task", body)
    return 0


def prepare_warm_start(workdir: Path, settings: BenchSettings) -> Path:
    """Build the task model and run the SFT warm-up once; return the warmed-up folder."""
    warm = workdir / "warm"
    command = [
        sys.executable,
        str(HERE / "grpo_plain_loop.py"),
        "--warmup-only",
        f"--save-warmup={warm}",
        f"--threads={settings.threads}",
    ]
    print(f"[warm-up] {' '.join(command)}", flush=True)
    with (workdir / "warmup.log").open("w") as log:
        subprocess.run(
            command,
            check=True,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=column_env(settings.threads),
        )
    return warm


def report_block(
    columns: list[ColumnResult],
    table: str,
    settings: BenchSettings,
    load_before: tuple[float, float, float],
    plot: Path,
) -> str:
    """The generated markdown block: machine, load, table, notes, plot."""
    from bench_support import machine_line

    load_after = os.getloadavg()
    lines = [
        f"Measured on {machine_line(['torch', 'transformers'])}; "
        f"torch threads {settings.threads}; load average (1 min) {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after the run.",
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


if __name__ == "__main__":
    raise SystemExit(main())
