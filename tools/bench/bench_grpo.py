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
from bench_support import column_env  # noqa: E402
from grpo_report import ColumnResult, plot_curves, report_block, summary_table  # noqa: E402

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
    hybridflow_modes: tuple[str, ...] = ("off",)
    """``trainer.async_mode`` of each HybridFlow column (the async modes also get
    ``trainer.placement=separate``)."""
    hybridflow_overrides: tuple[str, ...] = ()
    """Recipe overrides of every HybridFlow column, e.g. ``grpo.trainer.backend=local``."""


ASYNC_OVERRIDES = (
    "grpo.trainer.placement=separate",
    # the quickstart takes old_log_probs from the rollout (equal on-policy); an async step's
    # samples are a version or two old, so the actor recomputes them (async modes refuse the
    # rollout's: runs collapsed with them, docs/benchmarks.md "GRPO time to 0.9 over seeds")
    # and algorithm.rollout_correction's default ("auto") weighs the lag with TIS
    "grpo.actor.use_rollout_log_probs=false",
)
"""What every async HybridFlow column adds to the recipe (before ``--hybridflow-override``)."""

COLUMN_TIMEOUT_S = 1800.0
"""Longest a column's process may run before it is killed and reported as failed."""


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
    data = json.loads(result.read_text())
    startup = data.pop("startup_seconds", None)
    return ColumnResult(name, task.RunRecord(**data), "ok", wall, startup)


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
    result = workdir / f"plain_seed{settings.seed}.json"
    script = str(HERE / "grpo_plain_loop.py")
    command = [sys.executable, script, f"--init={warm}", f"--result={result}"]
    return run_process(
        "plain torch loop",
        command + column_args(settings),
        result,
        workdir / f"plain_seed{settings.seed}.log",
        settings.threads,
    )


def run_trl(warm: Path, settings: BenchSettings, workdir: Path, python: Path) -> ColumnResult:
    """TRL's GRPOTrainer, in the TRL venv's interpreter ``python``."""
    if not python.exists():
        return ColumnResult(
            "TRL GRPOTrainer", None, f"skipped: {python} missing; run tools/bench/setup_trl_venv.sh"
        )
    result = workdir / f"trl_seed{settings.seed}.json"
    command = [str(python), str(HERE / "grpo_trl.py"), f"--init={warm}", f"--result={result}"]
    return run_process(
        "TRL GRPOTrainer",
        command + column_args(settings),
        result,
        workdir / f"trl_seed{settings.seed}.log",
        settings.threads,
    )


def run_hybridflow(
    warm: Path, settings: BenchSettings, workdir: Path, mode: str = "off"
) -> ColumnResult:
    """HybridFlow: the quickstart recipe's GRPO stage from ``warm``, in its own process,
    with ``trainer.async_mode=mode`` (nothing is passed for ``off``, the default).

    The child (this script's ``hybridflow-column`` mode, :func:`hybridflow_column`) imports
    ``recipes.quickstart``; when that recipe or the trainer it uses is not importable yet,
    the column is reported as not available.
    """
    name = "HybridFlow" if mode == "off" else f"HybridFlow {mode}"
    probe = subprocess.run(
        [sys.executable, "-c", "import recipes.quickstart.main"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        why = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "import failed"
        return ColumnResult(name, None, f"not available yet ({why})")
    overrides = list(settings.hybridflow_overrides)
    if mode != "off":
        overrides = [*ASYNC_OVERRIDES, f"grpo.trainer.async_mode={mode}", *overrides]
    tag = f"hybridflow_{mode}_seed{settings.seed}"
    result = workdir / f"{tag}.json"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "hybridflow-column",
        f"--init={warm}",
        f"--result={result}",
        f"--workdir={workdir / tag}",
        f"--spawned={time.time()}",
        *(f"--override={override}" for override in overrides),
        *column_args(replace(settings, max_steps=settings.hybridflow_steps)),
    ]
    return run_process(name, command, result, workdir / f"{tag}.log", settings.threads)


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
    parser.add_argument("--override", action="append", default=[], help="recipe key=value")
    parser.add_argument("--spawned", type=float, help="time.time() when the parent spawned us")
    args = parser.parse_args(argv)
    if "grpo.trainer.backend=local" not in args.override:
        # The start-early phase of the `hybridflow` command: Ray starts while torch imports.
        from hf_controller import start_ray_in_background

        start_ray_in_background()

    import torch

    from hf_algos.data import write_rows
    from hf_algos.examples.reverse_letters import make_reverse_letters_rows, read_metrics
    from hf_algos.trainers import PPOTrainer
    from hf_protocol import DataProto
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
            "grpo.actor.engine.optim.schedule=constant",  # the recipe decays it (cosine)
            # the plain loop and TRL clip the gradient norm at 1.0 (TRL's default); the
            # recipe does not clip
            "grpo.actor.engine.optim.grad_clip=1.0",
            # the benchmark tokenizer puts <bos> in front: 6 letters, "=" and <bos>
            f"grpo.data.max_prompt_length={task.PROMPT_LENGTH}",
            *args.override,
        ],
    )
    config = grpo_config(raw, args.workdir, args.init, files)
    first_step: list[float] = []
    train_step = PPOTrainer.train_step

    def noting_first_step(trainer: PPOTrainer, batch: DataProto) -> dict[str, float]:
        if not first_step:  # start-up ends where the first step begins
            first_step.append(time.time())
        return train_step(trainer, batch)

    PPOTrainer.train_step = noting_first_step  # type: ignore[method-assign,assignment]
    run_grpo(config, args.workdir / "model_grpo")
    records = read_metrics(run_metrics_path(config))
    record = asdict(record_from_metrics(records, args.threads))
    if args.spawned is not None and first_step:
        record["startup_seconds"] = first_step[0] - args.spawned
    args.result.write_text(json.dumps(record))
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


RECORD_NAMES = {
    "plain": "plain torch loop",
    "trl": "TRL GRPOTrainer",
    "hybridflow_off": "HybridFlow",
}
"""Column name of a record file's prefix (``<prefix>_seed<n>.json``); other HybridFlow
prefixes are ``hybridflow_<mode>`` -> ``HybridFlow <mode>``."""


def read_records(workdirs: list[Path]) -> list[ColumnResult]:
    """The per-run records (``<column>_seed<n>.json``) that runs of this script left in
    ``workdirs``, as columns ordered by seed then column, e.g. to tabulate a run that was
    stopped before its end (process wall times are not in the records: 0)."""
    columns: list[tuple[int, int, ColumnResult]] = []
    for workdir in workdirs:
        for path in sorted(workdir.glob("*_seed*.json")):
            prefix, seed = path.stem.rsplit("_seed", 1)
            name = RECORD_NAMES.get(prefix, "HybridFlow " + prefix.removeprefix("hybridflow_"))
            data = json.loads(path.read_text())
            startup = data.pop("startup_seconds", None)
            record = task.RunRecord(**{**data, "name": name})
            order = [*RECORD_NAMES.values()].index(name) if name in RECORD_NAMES.values() else 9
            columns.append((int(seed), order, ColumnResult(name, record, "ok", 0.0, startup)))
    return [column for _, _, column in sorted(columns, key=lambda c: (c[0], c[1], c[2].name))]


def finals(columns: list[ColumnResult]) -> str:
    """One line per column: the last evaluation's accuracy of each run, in seed order."""
    by_name: dict[str, list[str]] = {}
    for column in columns:
        if column.record is not None and column.record.evals:
            by_name.setdefault(column.name, []).append(f"{column.record.evals[-1]['accuracy']:.2f}")
    return "\n".join(f"- {name}: {' / '.join(values)}" for name, values in by_name.items())


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
    parser.add_argument(
        "--hybridflow-modes",
        default="off",
        help="comma-separated trainer.async_mode values, one HybridFlow column each "
        "(off, one_step_off, fully_async)",
    )
    parser.add_argument(
        "--hybridflow-override",
        action="append",
        default=[],
        help="recipe override for every HybridFlow column, e.g. grpo.trainer.backend=local",
    )
    parser.add_argument("--seed", type=int, default=BenchSettings.seed, help="first seed")
    parser.add_argument("--seeds", type=int, default=1, help="runs per column: seed, seed+1, ...")
    parser.add_argument(
        "--summarize",
        type=Path,
        nargs="+",
        help="run nothing: tabulate the per-run records in these --workdir folders",
    )
    args = parser.parse_args(argv)
    if args.summarize:
        found = read_records(args.summarize)
        print(summary_table(found, BenchSettings.target) + "\n\nfinal accuracy per run:")
        print(finals(found))
        return 0
    settings = BenchSettings(
        hybridflow_steps=args.hybridflow_steps,
        max_steps=args.max_steps,
        eval_every=args.eval_every,
        threads=args.threads,
        stop_at_target=not args.no_stop,
        seed=args.seed,
        hybridflow_modes=tuple(args.hybridflow_modes.split(",")),
        hybridflow_overrides=tuple(args.hybridflow_override),
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    warm = args.init or prepare_warm_start(workdir, settings)
    names = args.columns.split(",")
    unknown = set(names) - {"plain", "trl", "hybridflow"}
    if unknown:
        raise SystemExit(f"unknown --columns {sorted(unknown)}; choose from plain, trl, hybridflow")
    columns: list[ColumnResult] = []
    for seed in range(settings.seed, settings.seed + args.seeds):
        run = replace(settings, seed=seed)
        for name in names:
            if name == "plain":
                columns.append(run_plain(warm, run, workdir))
            elif name == "trl":
                columns.append(run_trl(warm, run, workdir, args.trl_python))
            else:
                columns += [run_hybridflow(warm, run, workdir, m) for m in run.hybridflow_modes]
    first_seed = columns[: len(columns) // args.seeds]
    table = summary_table(columns, settings.target)
    plot = plot_curves(first_seed, settings.target, args.plot)
    seeds = f"{settings.seed}..{settings.seed + args.seeds - 1}"
    body = report_block(first_seed, table, settings, load_before, plot, seeds)
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


if __name__ == "__main__":
    raise SystemExit(main())
