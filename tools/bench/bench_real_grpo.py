"""GRPO on a real model, side by side: HybridFlow vs TRL's GRPOTrainer vs a plain
single-process torch loop, SmolLM2-135M-Instruct learning reasoning-gym's chain_sum on
this CPU.

One run does, in order (never two columns at once, so they do not share the cores):

1. ``prepare`` (a child process on the HybridFlow packages): HybridFlow's packaged config
   ``smollm2_chain_sum``, resolved with ``--cfg``, gives every column's settings (group
   size, prompts per step, response cap, temperature, lr, AdamW, clip, validation samples)
   and the model (its imported Hugging Face directory); its ``reasoning_gym:`` specs are
   generated once into ``train.jsonl`` / ``val.jsonl``, and for each seed the training rows
   are shuffled once into ``train_seed<n>.jsonl``, which every column reads in order;
2. for each seed, each column in its own process: the plain loop (``real_grpo_plain.py``,
   dev venv), TRL (``real_grpo_trl.py``, ``.venv-trl``) and HybridFlow
   (``hybridflow grpo --config-name smollm2_chain_sum`` with the seed, the steps, the
   validation interval and the row files as overrides; step time is its ``timing_s/step``,
   the curve its ``val/accuracy`` and ``val/sampled/accuracy``);
3. a table (median seconds per step, final greedy and sampled accuracy per seed, training
   seconds to reach TRL's final greedy accuracy), a PNG of greedy accuracy against
   training seconds and, with ``--output``, the generated block of ``docs/benchmarks.md``.

The plain loop and TRL validate with :func:`real_grpo_task.evaluate` (greedy, and
``val_samples`` samples per prompt at the training temperature, scored by HybridFlow's own
reasoning-gym scorer); HybridFlow with its trainer's validation, on the same rows.

Usage (from the repository root, dev venv; each step costs ~30-60 s of CPU, so the default
3 seeds x 24 steps x 3 columns take a couple of hours):

    bash tools/bench/setup_trl_venv.sh
    python tools/bench/bench_real_grpo.py --output docs/benchmarks.md

Every column computes in the config's one precision (:func:`precision_of`): as shipped
(``fsdp.param_dtype: auto``), fp32 on a CPU without AMX or AVX512_BF16; bf16 mixed
precision (fp32 master weights, bf16 compute; TRL's ``bf16=True``, the plain loop's CPU
autocast) with ``--hybridflow-override actor.engine.fsdp.param_dtype=bfloat16
--hybridflow-override rollout.dtype=bfloat16``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from bench_support import column_env  # noqa: E402

DEFAULT_TRL_PYTHON = HERE / ".venv-trl" / "bin" / "python"
DEFAULT_PLOT = ROOT / "docs" / "images" / "bench_real_grpo.png"
CONFIG_NAME = "smollm2_chain_sum"
PACKAGES = ("hf-algos", "hf-engines", "hf-rollout", "hf-controller", "hf-protocol")
COLUMNS = {
    "plain": "plain torch loop",
    "trl": "TRL GRPOTrainer",
    "hybridflow": "HybridFlow",
    "tinker": "Tinker API (hybridflow serve)",
}
"""Column key (``--columns``, record file prefix) -> name in the table."""
NOOP_CALLS = 30
"""One-token ``forward`` round trips the ``tinker`` column times after its run."""
COLUMN_TIMEOUT_S = 4 * 3600.0
"""Longest a column's process may run before it is killed and reported as failed."""
HYBRIDFLOW_CLI = "import sys; from hf_algos.cli import main; sys.exit(main())"


@dataclass
class Column:
    """One column's run on one seed: its record, or why there is none."""

    key: str
    """``plain``, ``trl`` or ``hybridflow``."""
    seed: int
    """The run's seed."""
    record: dict[str, Any] | None
    """The run record (:class:`real_grpo_task.RealRunRecord` as a dict)."""
    status: str
    """``ok``, or why the column is missing."""
    wall_seconds: float = 0.0
    """Wall time of the column's process, start-up and validation included."""


def hybridflow_env(hybridflow_root: Path, threads: int) -> dict[str, str]:
    """A column's environment with the HybridFlow packages of ``hybridflow_root`` in front."""
    env = column_env(threads)
    paths = [str(hybridflow_root / "packages" / p / "src") for p in PACKAGES]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def precision_of(config: dict[str, Any], hf_config: dict[str, Any] | None = None) -> str:
    """The one compute precision of every column: the actor's
    ``actor.engine.fsdp.param_dtype`` over fp32 master weights, with a rollout that
    generates in the same dtype; anything else exits naming the keys to set. ``auto`` is
    resolved as the trainer does, for this CPU and the model's config ``hf_config``."""
    from hf_engines.precision import resolve_auto_dtype

    engine = config["actor"]["engine"]
    precision = engine["fsdp"]["param_dtype"]
    follows = "auto" if precision == "auto" else engine["model"]["dtype"]
    rollout = config["rollout"]["dtype"] or follows
    if "auto" in (precision, rollout):
        auto = resolve_auto_dtype("cpu", hf_config).dtype
        precision, rollout = (auto if d == "auto" else d for d in (precision, rollout))
    if engine["model"]["dtype"] != "float32" or precision not in ("float32", "bfloat16"):
        raise SystemExit(
            f"the columns keep fp32 master weights and compute in float32 or bfloat16; the "
            f"config has actor.engine.model.dtype={engine['model']['dtype']}, "
            f"actor.engine.fsdp.param_dtype={precision}"
        )
    if rollout != precision:
        raise SystemExit(
            f"the columns generate in their compute precision; set rollout.dtype={precision} "
            f"(the config generates in {rollout}, actor.engine.fsdp.param_dtype={precision})"
        )
    return str(precision)


def prepare(
    workdir: Path, seeds: list[int], val_size: int | None, overrides: list[str] | None = None
) -> None:
    """Child process of :func:`run_prepare` (on the HybridFlow packages): write
    ``settings.json``, ``train.jsonl``, ``val.jsonl`` and ``train_seed<n>.jsonl`` from the
    packaged config with the HybridFlow column's ``overrides``."""
    import yaml

    from hf_algos.cli import main as hybridflow
    from hf_algos.data.reasoning_gym import reasoning_gym_rows
    from hf_engines.hub import resolve_model_path

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = hybridflow(["grpo", "--config-name", CONFIG_NAME, *(overrides or []), "--cfg"])
    if code != 0:
        raise SystemExit(f"hybridflow grpo --config-name {CONFIG_NAME} --cfg exited {code}")
    config = yaml.safe_load(printed.getvalue())
    model = Path(resolve_model_path(config["actor"]["engine"]["model"]["path"]))
    actor, optim, rollout = config["actor"], config["actor"]["engine"]["optim"], config["rollout"]
    if rollout["top_k"] not in (-1, 0) or rollout["top_p"] != 1.0:
        raise SystemExit(f"the columns sample without top-k/top-p; the config has {rollout}")
    if optim["schedule"] != "constant" or optim["warmup_steps"] != 0:
        raise SystemExit(f"the columns keep the lr constant; the config has {optim}")
    settings = {
        "prompts_per_step": config["data"]["train_batch_size"],
        "group_size": rollout["n"],
        "max_new_tokens": rollout["max_new_tokens"],
        "temperature": rollout["temperature"],
        "lr": optim["lr"],
        "weight_decay": optim["weight_decay"],
        "betas": optim["betas"],
        "adam_eps": optim["eps"],
        "grad_clip": optim["grad_clip"],
        "clip_low": actor["clip_low"],
        "clip_high": actor["clip_high"],
        "val_samples": config["trainer"]["val_samples"],
        "precision": precision_of(config, json.loads((model / "config.json").read_text())),
        "model": str(model),
    }
    (workdir / "settings.json").write_text(json.dumps(settings, indent=1))
    (workdir / "hybridflow_config.yaml").write_text(printed.getvalue())
    (train_spec,), (val_spec,) = config["data"]["train_files"], config["data"]["val_files"]
    train = reasoning_gym_rows(train_spec)
    write_jsonl(workdir / "train.jsonl", train)
    write_jsonl(workdir / "val.jsonl", reasoning_gym_rows(val_spec)[:val_size])
    for seed in seeds:
        order = list(range(len(train)))
        random.Random(seed).shuffle(order)
        write_jsonl(workdir / f"train_seed{seed}.jsonl", [train[i] for i in order])


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """One JSON row a line."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def run_prepare(args: argparse.Namespace, seeds: list[int]) -> dict[str, Any]:
    """Run :func:`prepare` in a child process on ``--hybridflow-root``'s packages; return
    the settings it wrote."""
    command = [sys.executable, str(Path(__file__).resolve()), "prepare", str(args.workdir)]
    command += [f"--seeds={','.join(map(str, seeds))}"]
    if args.val_size is not None:
        command.append(f"--val-size={args.val_size}")
    command += [f"--override={override}" for override in args.hybridflow_override]
    print(f"[prepare] {' '.join(command)}", flush=True)
    env = hybridflow_env(args.hybridflow_root, args.threads)
    subprocess.run(command, check=True, env=env, cwd=args.workdir)
    settings: dict[str, Any] = json.loads((args.workdir / "settings.json").read_text())
    return settings


def run_process(
    key: str, seed: int, command: list[str], workdir: Path, env: dict[str, str]
) -> Column:
    """Run one column's process; read the record it writes to ``<key>_seed<n>.json``."""
    tag = f"{key}_seed{seed}"
    result, log = workdir / f"{tag}.json", workdir / f"{tag}.log"
    started = time.perf_counter()
    print(f"[{tag}] {' '.join(command)}", flush=True)
    try:
        with log.open("w") as handle:
            proc = subprocess.run(
                command,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=workdir,
                timeout=COLUMN_TIMEOUT_S,
            )
    except subprocess.TimeoutExpired:
        return Column(key, seed, None, f"timed out after {COLUMN_TIMEOUT_S:.0f}s; log {log}")
    wall = time.perf_counter() - started
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-2000:]
        return Column(key, seed, None, f"failed (exit {proc.returncode}); log {log}:\n{tail}", wall)
    return Column(key, seed, json.loads(result.read_text()), "ok", wall)


def baseline_command(python: Path, key: str, args: argparse.Namespace, seed: int) -> list[str]:
    """The command line of the plain loop (``key`` ``plain``) or the TRL column (``trl``)."""
    work = args.workdir
    return [
        str(python),
        str(HERE / f"real_grpo_{key}.py"),
        f"--settings={work / 'settings.json'}",
        f"--train={work / f'train_seed{seed}.jsonl'}",
        f"--val={work / 'val.jsonl'}",
        f"--result={work / f'{key}_seed{seed}.json'}",
        f"--steps={args.steps}",
        f"--eval-every={args.eval_every}",
        f"--seed={seed}",
        f"--threads={args.threads}",
    ]


def run_hybridflow(args: argparse.Namespace, seed: int) -> Column:
    """``hybridflow grpo --config-name smollm2_chain_sum`` on the seed's rows; its
    ``metrics.jsonl`` becomes the record (:func:`record_from_metrics`)."""
    run_dir = args.workdir / f"hybridflow_seed{seed}"
    command = [
        sys.executable,
        "-c",
        HYBRIDFLOW_CLI,
        "grpo",
        "--config-name",
        CONFIG_NAME,
        f"vars.workdir={run_dir}",
        f"trainer.seed={seed}",
        f"data.seed={seed}",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.eval_every}",
        "trainer.progress_bar=false",
        # the rows every column reads, in the same order
        f"data.train_files=[{args.workdir / f'train_seed{seed}.jsonl'}]",
        f"data.val_files=[{args.workdir / 'val.jsonl'}]",
        "data.shuffle=false",
        *args.hybridflow_override,
    ]
    env = hybridflow_env(args.hybridflow_root, args.threads)
    column = run_process("hybridflow", seed, command, args.workdir, env)
    metrics = sorted(run_dir.rglob("metrics.jsonl"))
    if not metrics:
        return column
    # the CLI writes no record of ours: it is built from the trainer's metrics
    record = record_from_metrics(metrics[-1], args.threads)
    if len(record["step_seconds"]) < args.steps:
        done = len(record["step_seconds"])
        return Column("hybridflow", seed, None, f"{column.status} ({done} steps logged)")
    (args.workdir / f"hybridflow_seed{seed}.json").write_text(json.dumps(record, indent=1))
    return Column("hybridflow", seed, record, "ok", column.wall_seconds)


def record_from_metrics(path: Path, threads: int) -> dict[str, Any]:
    """A run record from the trainer's ``metrics.jsonl`` (``timing_s/step``,
    ``val/accuracy``, ``val/sampled/accuracy``, ``critic/score/mean`` or the like)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    record: dict[str, Any] = {
        "name": "HybridFlow",
        "step_seconds": [],
        "step_cpu_seconds": [],
        "evals": [],
        "rewards": [],
        "notes": f"packaged config {CONFIG_NAME}; threads {threads}",
    }
    seconds_at, total = {0: 0.0}, 0.0
    for row in rows:
        if "timing_s/step" in row:
            total += float(row["timing_s/step"])
            record["step_seconds"].append(float(row["timing_s/step"]))
            seconds_at[int(row["step"])] = total
            reward = next((row[k] for k in ("critic/score/mean", "reward/mean") if k in row), None)
            if reward is not None:
                record["rewards"].append(float(reward))
    for row in rows:
        if "val/accuracy" in row:  # validation before training is logged at step 0
            step = int(row["step"])
            record["evals"].append(
                {
                    "step": step,
                    "train_seconds": seconds_at.get(step, total),
                    "greedy": float(row["val/accuracy"]),
                    "sampled": float(row.get("val/sampled/accuracy", float("nan"))),
                }
            )
    return record


def first_crossing(record: dict[str, Any], target: float) -> dict[str, float] | None:
    """The first validation after step 0 whose greedy accuracy is at least ``target``."""
    return next((e for e in record["evals"][1:] if e["greedy"] >= target - 1e-9), None)


def summary_table(columns: list[Column]) -> tuple[str, float | None]:
    """The markdown table over seeds, and the target: the median over seeds of TRL's final
    greedy accuracy (``None`` without a TRL run)."""
    trl = [c.record["evals"][-1]["greedy"] for c in columns if c.key == "trl" and c.record]
    target = statistics.median(trl) if trl else None
    goal = f"{target:.3f}" if target is not None else "-"
    lines = [
        f"| column | runs | s/step (median) | CPU s/step | final greedy acc per seed | "
        f"final sampled acc per seed | reached TRL's final greedy ({goal}) | "
        f"train s to it (median) |",
        "|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for key, name in COLUMNS.items():
        runs = [c for c in columns if c.key == key]
        if not runs:
            continue
        done = [c.record for c in runs if c.record is not None and c.record["step_seconds"]]
        if not done:
            lines.append(f"| {name} | 0 | {runs[0].status.splitlines()[0]} | | | | | |")
            continue
        steps = [statistics.median(r["step_seconds"]) for r in done]
        cpu = [statistics.median(r["step_cpu_seconds"]) for r in done if r["step_cpu_seconds"]]
        greedy = " / ".join(f"{r['evals'][-1]['greedy']:.3f}" for r in done)
        sampled = " / ".join(f"{r['evals'][-1]['sampled']:.3f}" for r in done)
        hits = [h for h in (first_crossing(r, target) for r in done) if h] if target else []
        seconds = f"{statistics.median(h['train_seconds'] for h in hits):.0f}" if hits else "-"
        lines.append(
            f"| {name} | {len(done)} | {statistics.median(steps):.1f} | "
            f"{f'{statistics.median(cpu):.1f}' if cpu else '-'} | {greedy} | {sampled} | "
            f"{len(hits)}/{len(done)} | {seconds} |"
        )
    return "\n".join(lines), target


def plot_curves(columns: list[Column], target: float | None, path: Path) -> Path:
    """PNG of greedy accuracy against training seconds: a colour per column, a line per
    seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.2))
    colours = dict(zip(COLUMNS, ("tab:grey", "tab:orange", "tab:blue", "tab:green"), strict=True))
    labelled: set[str] = set()
    for column in columns:
        if column.record is None:
            continue
        evals = column.record["evals"]
        label = None if column.key in labelled else COLUMNS[column.key]
        labelled.add(column.key)
        axis.plot(
            [e["train_seconds"] for e in evals],
            [e["greedy"] for e in evals],
            marker="o",
            markersize=3,
            color=colours[column.key],
            alpha=0.8,
            label=label,
        )
    if target is not None:
        axis.axhline(target, color="grey", linestyle="--", linewidth=1, label="TRL's final")
    axis.set_xlabel("training seconds (validation excluded)")
    axis.set_ylabel("greedy accuracy (held-out chain_sum)")
    axis.set_title("GRPO, SmolLM2-135M-Instruct on chain_sum, CPU")
    axis.set_ylim(0, 1)
    axis.legend(loc="lower right")
    axis.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def noop_lines(columns: list[Column]) -> list[str]:
    """The Tinker column's cost per API call: its one-token ``forward`` round trips, as a
    share of its median step."""
    lines = []
    for column in columns:
        record = column.record or {}
        calls = record.get("noop_call_seconds")
        if column.key != "tinker" or not calls or not record.get("step_seconds"):
            continue
        call, step = statistics.median(calls), statistics.median(record["step_seconds"])
        lines.append(
            f"- Tinker API seed {column.seed}: a one-token `forward` round trip takes "
            f"{call * 1000:.0f} ms (median of {len(calls)}), {100 * call / step:.1f}% of its "
            f"median step ({step:.1f} s); a step makes "
            f"{record.get('calls_per_step', 'about 1 + prompts + 2')} API calls; median "
            f"seconds per phase: {json.dumps(record.get('phase_seconds', {}))}."
        )
    return lines


def report_block(
    columns: list[Column],
    table: str,
    args: argparse.Namespace,
    settings: dict[str, Any],
    loads: tuple[float, float],
    plot: Path,
) -> str:
    """The generated markdown block: machine, settings, table, notes, failures, plot."""
    from bench_support import machine_line

    seeds = sorted({c.seed for c in columns})
    shown = {k: v for k, v in settings.items() if k != "model"}
    lines = [
        f"Measured on {machine_line(['torch', 'transformers'])}; torch threads "
        f"{args.threads}; load average (1 min) {loads[0]:.1f}-{loads[1]:.1f} at the start "
        f"and end of the columns' runs; seeds {seeds}; {args.steps} steps, "
        f"validation every {args.eval_every}. Settings (HybridFlow's `{CONFIG_NAME}`, "
        f"resolved): `{json.dumps(shown)}`. HybridFlow overrides: "
        f"{' '.join(args.hybridflow_override) or 'none'}.",
        "",
        table,
        "",
    ]
    for column in columns:
        if column.record is None:
            lines.append(f"- {COLUMNS[column.key]} seed {column.seed}: {column.status[:300]}")
    lines += noop_lines(columns)
    try:
        relative = plot.resolve().relative_to((ROOT / "docs").resolve())
    except ValueError:
        relative = plot
    lines += ["", f"![greedy accuracy against training seconds]({relative})"]
    return "\n".join(lines)


def run_column(args: argparse.Namespace, name: str, seed: int) -> Column:
    """Run one column on one seed in its own process (TRL: skipped without its venv)."""
    if name == "hybridflow":
        return run_hybridflow(args, seed)
    if name == "trl" and not args.trl_python.exists():
        why = f"skipped: {args.trl_python} missing; run tools/bench/setup_trl_venv.sh"
        return Column(name, seed, None, why)
    python = args.trl_python if name == "trl" else Path(sys.executable)
    command = baseline_command(python, name, args, seed)
    if name == "tinker":  # and the API's cost per call: one-token forward round trips
        command += ["--noop-calls", str(NOOP_CALLS)]
    return run_process(name, seed, command, args.workdir, column_env(args.threads))


def record_load(workdir: Path, run: str, before: float, after: float) -> None:
    """Keep one run's 1-minute load averages (start, end) in ``workdir/loads.json``, so a
    table summarized later from several invocations still says what load it ran under."""
    path = workdir / "loads.json"
    loads = json.loads(path.read_text()) if path.exists() else {}
    loads[run] = [round(before, 2), round(after, 2)]
    path.write_text(json.dumps(loads, indent=1, sort_keys=True))


def read_loads(workdir: Path, load_before: float) -> tuple[float, float]:
    """The lowest and highest load average the runs in ``workdir`` started or ended at
    (``loads.json``); without it, ``load_before`` (this call's start) and the load now."""
    path = workdir / "loads.json"
    if not path.exists():
        return load_before, os.getloadavg()[0]
    values = [v for pair in json.loads(path.read_text()).values() for v in pair]
    return min(values), max(values)


def read_columns(workdir: Path) -> list[Column]:
    """The run records (``<key>_seed<n>.json``) left in ``workdir``, by seed then column."""
    found = []
    for path in workdir.glob("*_seed*.json"):
        key, seed = path.stem.rsplit("_seed", 1)
        if key in COLUMNS:
            found.append(Column(key, int(seed), json.loads(path.read_text()), "ok"))
    order = list(COLUMNS)
    return sorted(found, key=lambda c: (c.seed, order.index(c.key)))


def main(argv: list[str] | None = None) -> int:
    """Command line: prepare the rows, run every column per seed, report."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "prepare":
        sub = argparse.ArgumentParser()
        sub.add_argument("workdir", type=Path)
        sub.add_argument("--seeds", required=True)
        sub.add_argument("--val-size", type=int)
        sub.add_argument("--override", action="append", default=[])
        ns = sub.parse_args(argv[1:])
        prepare(ns.workdir, [int(s) for s in ns.seeds.split(",")], ns.val_size, ns.override)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--columns", default="plain,trl,hybridflow", help="comma-separated")
    parser.add_argument("--seeds", type=int, default=3, help="runs per column: seed, seed+1..")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--eval-every", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trl-python", type=Path, default=DEFAULT_TRL_PYTHON)
    parser.add_argument("--workdir", type=Path, help="keep rows, logs and records here")
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT)
    parser.add_argument("--output", type=Path, help="write the block into this markdown file")
    parser.add_argument(
        "--hybridflow-root",
        type=Path,
        default=ROOT,
        help="repository whose packages (and packaged config) run HybridFlow and give the "
        "settings (default: this one)",
    )
    parser.add_argument(
        "--hybridflow-override",
        action="append",
        default=[],
        help="extra key=value for the HybridFlow column, also read for every column's "
        "settings (e.g. actor.engine.fsdp.param_dtype=bfloat16 with rollout.dtype=bfloat16: "
        "all columns in bf16 mixed precision)",
    )
    parser.add_argument(
        "--summarize", action="store_true", help="run nothing: tabulate --workdir's records"
    )
    parser.add_argument("--val-size", type=int, help=argparse.SUPPRESS)  # smoke tests only
    args = parser.parse_args(argv)
    names = args.columns.split(",")
    if set(names) - set(COLUMNS):
        raise SystemExit(f"unknown --columns {sorted(set(names) - set(COLUMNS))}; use {COLUMNS}")
    args.workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="bench-real-grpo-"))).resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.hybridflow_root = args.hybridflow_root.resolve()
    seeds = list(range(args.seed, args.seed + args.seeds))
    load_before = os.getloadavg()[0]
    if args.summarize:
        columns = read_columns(args.workdir)
        settings = json.loads((args.workdir / "settings.json").read_text())
    else:
        settings = run_prepare(args, seeds)
        columns = []
        for seed in seeds:
            for name in names:
                before = os.getloadavg()[0]
                columns.append(run_column(args, name, seed))
                record_load(args.workdir, f"{name}_seed{seed}", before, os.getloadavg()[0])
    table, target = summary_table(columns)
    plot = plot_curves(columns, target, args.plot)
    loads = read_loads(args.workdir, load_before)
    body = report_block(columns, table, args, settings, loads, plot)
    print("\n" + body)
    (args.workdir / "columns.json").write_text(json.dumps([asdict(c) for c in columns]))
    if args.output is not None:
        from bench_support import write_section

        title = "## GRPO on SmolLM2-135M-Instruct (chain_sum)"
        write_section(args.output, "real_grpo", title, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
