"""Offline DPO side by side: HybridFlow's ``DPOTrainer`` vs TRL's ``DPOTrainer``, per loss.

One run does, in order (never two columns at once, so they do not share the cores):

1. builds the recipe's tiny Qwen2 + character tokenizer once (``save_pretrained``) and the
   recipe's generated reverse-four-letters preference pairs (``train.jsonl``, ``val.jsonl``);
2. for each loss type (sigmoid, ipo, hinge), each column in its own process from that one
   folder: HybridFlow (this script's ``hybridflow-column`` mode: ``recipes.dpo.main.run``
   with the benchmark's overrides) and TRL (``dpo_trl.py`` in ``.venv-trl``), each writing
   a JSON record of per-step loss, chosen/rejected rewards, margin, batch accuracy and the
   held-out pair accuracy before training and every ``--eval-every`` steps;
3. checks the agreement (:data:`TOLERANCE`), prints and writes a table, a PNG of loss and
   margin per step and, with ``--output``, the generated block of ``docs/benchmarks.md``.
   Exits 1 when a tolerance is missed or a column's final accuracy is below ``--target``.

Same model, same pairs in file order (no shuffling), same batch (one micro-batch, no
gradient accumulation), AdamW with the same lr / betas / eps, no weight decay, constant lr
without warm-up, gradient-norm clip 1.0, the same beta, fp32, dropout off.

Usage (from the repository root, dev venv)::

    bash tools/bench/setup_trl_venv.sh
    python tools/bench/bench_dpo.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from bench_support import column_env  # noqa: E402
from dpo_report import TOLERANCE, check_agreement, plot_curves, report_block  # noqa: E402

DEFAULT_TRL_PYTHON = HERE / ".venv-trl" / "bin" / "python"
DEFAULT_PLOT = ROOT / "docs" / "images" / "bench_dpo.png"
LOSS_TYPES = ("sigmoid", "ipo", "hinge")
COLUMN_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class BenchSettings:
    """What both columns are asked to do."""

    steps: int = 150
    eval_every: int = 25
    lr: float = 1e-3
    beta: float = 0.5
    batch: int = 64
    """Pairs per optimizer step."""
    train_pairs: int = 2048
    val_pairs: int = 64
    threads: int = 2

    def flags(self) -> list[str]:
        """Command-line flags both column scripts take."""
        return [
            f"--steps={self.steps}",
            f"--eval-every={self.eval_every}",
            f"--lr={self.lr}",
            f"--beta={self.beta}",
            f"--batch={self.batch}",
            f"--threads={self.threads}",
        ]


def run_column(name: str, command: list[str], result: Path, threads: int) -> dict[str, Any]:
    """Run one column's process; return its record (``error`` set when it failed)."""
    log = result.with_suffix(".log")
    print(f"[{name}] {' '.join(command)}", flush=True)
    started = time.perf_counter()
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
        return {"name": name, "error": f"timed out after {COLUMN_TIMEOUT_S:.0f}s; log {log}"}
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-2000:]
        return {"name": name, "error": f"failed (exit {proc.returncode}); log {log}:\n{tail}"}
    record: dict[str, Any] = json.loads(result.read_text())
    record["wall_seconds"] = time.perf_counter() - started
    return record


def prepare(workdir: Path, settings: BenchSettings) -> tuple[Path, Path]:
    """The recipe's tiny model + tokenizer and its generated pairs, written once."""
    from hf_algos.data import build_char_tokenizer
    from hf_engines.testing import build_tiny_model
    from recipes.dpo.synthetic import write_preference_files

    model = build_tiny_model(workdir / "model", "qwen2")
    build_char_tokenizer(model, chat_template=None)
    data = workdir / "data"
    write_preference_files(data, settings.train_pairs, settings.val_pairs)
    return model, data


def hybridflow_column(argv: list[str]) -> int:
    """Child process: the DPO recipe from ``--init`` on ``--data`` -> JSON record.

    The recipe's config with the benchmark's settings: file order (``data.shuffle=false``),
    one micro-batch per step, the lr, beta, loss type and step count given.
    """
    parser = argparse.ArgumentParser()
    for flag in ("--init", "--data", "--result", "--workdir"):
        parser.add_argument(flag, type=Path, required=True)
    parser.add_argument("--loss-type", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--eval-every", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--beta", type=float, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--override", action="append", default=[], help="recipe key=value")
    args = parser.parse_args(argv)

    import torch

    from recipes.dpo.main import run

    torch.set_num_threads(args.threads)
    overrides = [
        f"recipe.model_path={args.init}",
        f"recipe.workdir={args.workdir}",
        f"data.train_files=[{args.data / 'train.jsonl'}]",
        f"data.val_files=[{args.data / 'val.jsonl'}]",
        "data.shuffle=false",
        f"data.train_batch_size={args.batch}",
        f"dpo.mini_batch_size={args.batch}",
        f"actor.engine.micro_batch.micro_batch_size={2 * args.batch}",
        f"actor.engine.optim.lr={args.lr}",
        "actor.engine.optim.weight_decay=0.0",
        "actor.engine.optim.grad_clip=1.0",
        "actor.engine.optim.warmup_steps=0",
        "actor.engine.optim.schedule=constant",
        f"dpo.beta={args.beta}",
        f"dpo.loss_type={args.loss_type}",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.eval_every}",
        "trainer.val_before_train=true",
        "trainer.progress_bar=false",
        "trainer.loggers=[jsonl]",
        *args.override,
    ]
    run(overrides)
    (log,) = sorted((args.workdir / "logs").rglob("*.jsonl"))
    steps, evals, seconds = [], [], []
    for line in log.read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if "actor/dpo_loss" in row:
            steps.append(
                {
                    "step": int(row["step"]),
                    "loss": row["actor/dpo_loss"],
                    "chosen": row["actor/reward_chosen"],
                    "rejected": row["actor/reward_rejected"],
                    "margin": row["actor/reward_margin"],
                    "accuracy": row["actor/reward_accuracy"],
                }
            )
            seconds.append(row["timing_s/step"])
        if "val/dpo/reward_accuracy" in row:
            evals.append(
                {
                    "step": int(row["step"]),
                    "accuracy": row["val/dpo/reward_accuracy"],
                    "margin": row["val/dpo/reward_margin"],
                }
            )
    record = {
        "name": "HybridFlow DPOTrainer",
        "loss_type": args.loss_type,
        "steps": steps,
        "evals": evals,
        "step_seconds": seconds,
        "notes": f"recipes/dpo config + overrides; threads {args.threads}",
    }
    args.result.write_text(json.dumps(record, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: both columns for every loss type, the checks and the report."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "hybridflow-column":
        return hybridflow_column(argv[1:])
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--loss-types", default=",".join(LOSS_TYPES), help="comma-separated")
    parser.add_argument("--trl-python", type=Path, default=DEFAULT_TRL_PYTHON)
    parser.add_argument("--workdir", type=Path, help="keep model, data, logs and records here")
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT)
    parser.add_argument("--output", type=Path, help="write the block into this markdown file")
    parser.add_argument("--jobs", type=int, default=1, help="loss types run at once")
    parser.add_argument("--target", type=float, default=0.9, help="final held-out accuracy")
    parser.add_argument(
        "--hybridflow-override", action="append", default=[], help="recipe key=value"
    )
    defaults = BenchSettings()
    for name in ("steps", "eval_every", "lr", "beta", "batch", "threads"):
        value = getattr(defaults, name)
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args(argv)
    settings = BenchSettings(
        steps=args.steps,
        eval_every=args.eval_every,
        lr=args.lr,
        beta=args.beta,
        batch=args.batch,
        threads=args.threads,
    )
    if not args.trl_python.exists():
        raise SystemExit(f"{args.trl_python} missing; run bash tools/bench/setup_trl_venv.sh")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-dpo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    model, data = prepare(workdir, settings)

    def both_columns(loss_type: str) -> list[dict[str, Any]]:
        shared = [f"--init={model}", f"--data={data}", f"--loss-type={loss_type}"]
        shared += settings.flags()
        result = workdir / f"hybridflow_{loss_type}.json"
        command = [sys.executable, str(Path(__file__).resolve()), "hybridflow-column"]
        command += [*shared, f"--result={result}", f"--workdir={workdir / f'hf_{loss_type}'}"]
        command += [f"--override={o}" for o in args.hybridflow_override]
        hybridflow = run_column(f"HybridFlow {loss_type}", command, result, settings.threads)
        result = workdir / f"trl_{loss_type}.json"
        command = [str(args.trl_python), str(HERE / "dpo_trl.py"), *shared, f"--result={result}"]
        return [hybridflow, run_column(f"TRL {loss_type}", command, result, settings.threads)]

    loss_types = args.loss_types.split(",")
    # --jobs > 1 runs loss types at once (each one's two columns still one after the
    # other): the agreement is numeric, so sharing the cores changes times, not results.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = dict(zip(loss_types, pool.map(both_columns, loss_types), strict=True))
    load_after = os.getloadavg()
    checks = {name: check_agreement(pair, args.target) for name, pair in runs.items()}
    plot = plot_curves(runs, args.plot)
    body = report_block(runs, checks, settings, (load_before, load_after), plot, args.target)
    print("\n" + body)
    (workdir / "runs.json").write_text(json.dumps(runs))
    if args.output is not None:
        from bench_support import write_section

        write_section(args.output, "dpo", "## Offline DPO vs TRL's DPOTrainer", body)
    failed = [name for name, check in checks.items() if not check.ok]
    if failed:
        print(f"agreement or target missed for {failed} (tolerance {TOLERANCE})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
