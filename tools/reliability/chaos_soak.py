"""A chaos soak: the async quickstart with a worker of a random role SIGKILLed every few minutes.

The run is ``hybridflow grpo --config-name quickstart_fully_async`` (its packaged model,
task and settings) with ``trainer.max_restarts`` on and a checkpoint every
``--save-every`` steps, built and trained in this process so that a killer thread can
reach its workers. Every ``--kill-every`` seconds (jittered by ``--seed``) the killer
SIGKILLs one process of a random role:

* ``train``: a training worker (actor): the trainer re-creates its groups and resumes
  from its last checkpoint (``trainer/restarts``);
* ``rollout``: the rollout worker: its group is replaced and the prompts it held are
  generated again (``rollout/replaced_total``, docs/reliability.md).

It then runs the same config undisturbed, with the same seed (and, for the accuracy
spread, other seeds), and checks:

1. exactly-once accounting: every step of the disturbed run trained on the same prompts,
   each the same number of times, as the undisturbed run's same step (the loader is
   seeded, so this is the epoch's every prompt once, in order);
2. every injected fault is visible: restarts + replacements in the metrics equal the
   faults injected, and the run's log has a warning for each;
3. the final validation accuracy lies within the undisturbed seeds' spread (widened by
   ``--tolerance``).

Usage (dev venv, repository root; a benchmark, not a test):

    python tools/reliability/chaos_soak.py --minutes 30 --output docs/reliability.md
    python tools/reliability/chaos_soak.py --short    # CI: 2 faults (train, rollout), 60 steps
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("train", "rollout")
SHORT = (  # CI: no accuracy is judged, so no warm-up and no validation
    "vars.model='${reverse_letters.model:${vars.workdir}/model_init}'",
    "trainer.val_before_train=false",
    "trainer.test_freq=0",
)
STEP_SECONDS = 0.25
"""Seconds per step of the async quickstart on 2 cores, validation and checkpoints included
(measured 2026-12-05: 590 steps in 3.5 min); ``--minutes`` becomes steps through it. A run
that ends before its faults were all injected fails the soak ("run too short")."""
SOAK_START = "<!-- chaos soak: start -->"
SOAK_END = "<!-- chaos soak: end -->"


@dataclass
class Fault:
    """One injected kill."""

    seconds: float
    """Since the run's first step."""
    step: int
    role: str
    pid: int


@dataclass
class SoakRun:
    """What one run (disturbed or not) did."""

    seed: int
    trained: dict[int, Counter[str]] = field(default_factory=dict)
    """Step -> the prompts its update trained on (the last time the step ran)."""
    history: list[dict[str, float]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    logged: list[dict[str, float]] = field(default_factory=list)
    """Every row of the run's metrics.jsonl (restarts are logged there, not in history)."""
    minutes: float = 0.0

    @property
    def accuracy(self) -> float:
        """The last validation accuracy of the run."""
        values = [m["val/accuracy"] for m in self.history if "val/accuracy" in m]
        return values[-1] if values else float("nan")

    def counted(self, name: str) -> float:
        """The largest value of metric ``name`` the run logged (0 if never)."""
        return max((m[name] for m in self.logged if name in m), default=0.0)


class _Warnings(logging.Handler):
    """Keeps the warnings of the trainers' loggers (a fault must leave one)."""

    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage().splitlines()[0])


def _config(
    workdir: Path, label: str, seed: int, steps: int, save_every: int, extra: list[str]
) -> Any:
    """The packaged fully-async quickstart, built as ``hybridflow grpo`` builds it; the
    example's files are made once under ``workdir``, each run logs under its ``label``."""
    from hf_algos.cli.main import (
        COMMANDS,
        build_parser,
        compose_command_config,
        load_command_config,
        parse_arguments,
    )

    argv = [
        "grpo",
        "--config-name",
        "quickstart_fully_async",
        f"vars.workdir={workdir / 'shared'}",
        f"trainer.seed={seed}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={save_every}",
        f"trainer.checkpoint_dir={workdir / label / 'ckpt'}",
        "trainer.max_checkpoints=2",  # a restart resumes from the last one
        "trainer.max_restarts=1000",
        "trainer.export_dir=null",
        "trainer.loggers=[jsonl]",
        f"trainer.log_dir={workdir / label / 'logs'}",
        "trainer.progress_bar=false",
        "rollout.max_replacements=1000",
        *extra,
    ]
    args = parse_arguments(build_parser(), argv)
    command = COMMANDS["grpo"]
    config, _ = load_command_config(command, args, compose_command_config(command, args))
    return config


def _pid_of(trainer: Any, role: str, rng: random.Random) -> int:
    """The pid of one worker of ``role`` in ``trainer``'s current groups."""
    import ray

    group: Any = trainer.roles.owned[0] if role == "train" else trainer.roles.rollout
    worker = rng.choice(list(group.workers))
    return int(ray.get(worker._hf_process_info.remote(), timeout=30)["pid"])


def _killer(
    trainer: Any, run: SoakRun, every_s: float, count: int, stop: threading.Event, cycle: bool
) -> None:
    """Every ``every_s`` seconds (jittered) SIGKILL a worker of a random role (``cycle``:
    the roles in turn), ``count`` times at most; waits for a step after the last fault so
    each fault hits a healthy run."""
    rng = random.Random(run.seed)
    start = time.monotonic()
    while len(run.faults) < count and not stop.wait(every_s * rng.uniform(0.75, 1.25)):
        step = trainer.global_step
        while not stop.is_set() and (trainer.global_step <= step or _busy(trainer)):
            stop.wait(0.2)  # a step done since: the run is training, not restarting
        if stop.is_set():
            return
        role = ROLES[len(run.faults) % len(ROLES)] if cycle else rng.choice(ROLES)
        try:
            pid = _pid_of(trainer, role, rng)
        except Exception as error:  # groups being re-created: try at the next tick
            print(f"chaos: no {role} worker to kill now ({error})", flush=True)
            continue
        os.kill(pid, signal.SIGKILL)
        fault = Fault(time.monotonic() - start, trainer.global_step, role, pid)
        run.faults.append(fault)
        print(f"chaos: killed {role} pid {pid} at step {fault.step}", flush=True)


def _busy(trainer: Any) -> bool:
    """Whether the trainer is between groups (a restart or a replacement in progress)."""
    return getattr(trainer, "roles", None) is None


def soak_run(
    workdir: Path,
    label: str,
    seed: int,
    steps: int,
    save_every: int,
    kills: int = 0,
    every_s: float = 0.0,
    cycle: bool = False,
    extra: tuple[str, ...] = (),
) -> SoakRun:
    """One run of ``steps`` steps, with ``kills`` faults every ``every_s`` seconds."""
    from hf_algos.trainers import PPOTrainer
    from hf_protocol import fields

    run = SoakRun(seed)

    class SoakTrainer(PPOTrainer):
        def update(self, batch: Any, metrics: Any, timing: Any) -> None:
            prompts = batch.non_tensor_batch[fields.RAW_PROMPT]
            run.trained[self.global_step] = Counter(str(p) for p in prompts)
            super().update(batch, metrics, timing)

    handler = _Warnings(run.warnings)
    logging.getLogger("hf_algos").addHandler(handler)
    stop = threading.Event()
    start = time.monotonic()
    try:
        with SoakTrainer(_config(workdir, label, seed, steps, save_every, list(extra))) as trainer:
            killer = threading.Thread(
                target=_killer, args=(trainer, run, every_s, kills, stop, cycle), daemon=True
            )
            if kills:
                killer.start()
            run.history = trainer.fit()
            stop.set()
    finally:
        stop.set()
        logging.getLogger("hf_algos").removeHandler(handler)
    run.minutes = (time.monotonic() - start) / 60
    for path in (workdir / label / "logs").rglob("metrics.jsonl"):
        run.logged += [json.loads(line) for line in path.read_text().splitlines() if line]
    return run


def check(
    disturbed: SoakRun, undisturbed: list[SoakRun], kills: int, tolerance: float
) -> list[str]:
    """What the soak must show (see the module docstring); the problems found."""
    problems = []
    if len(disturbed.faults) < kills:
        problems.append(f"only {len(disturbed.faults)} of {kills} faults injected (run too short)")
    same_seed = next(r for r in undisturbed if r.seed == disturbed.seed)
    if disturbed.trained != same_seed.trained:
        differ = [s for s in same_seed.trained if disturbed.trained.get(s) != same_seed.trained[s]]
        problems.append(f"steps trained on other prompts than undisturbed: {differ[:10]}")
    seen = disturbed.counted("trainer/restarts") + disturbed.counted("rollout/replaced_total")
    if seen != len(disturbed.faults):
        problems.append(f"{len(disturbed.faults)} faults injected, {seen:.0f} in the metrics")
    noted = [w for w in disturbed.warnings if "died" in w or "replacing" in w]
    if len(noted) < len(disturbed.faults):
        problems.append(f"{len(disturbed.faults)} faults, {len(noted)} warnings naming them")
    if undisturbed and tolerance >= 0:
        accuracies = [r.accuracy for r in undisturbed]
        low, high = min(accuracies) - tolerance, max(accuracies) + tolerance
        if not low <= disturbed.accuracy <= high:
            problems.append(
                f"accuracy {disturbed.accuracy:.3f} outside the undisturbed spread "
                f"[{min(accuracies):.3f}, {max(accuracies):.3f}] +- {tolerance}"
            )
    return problems


def report(
    disturbed: SoakRun, undisturbed: list[SoakRun], problems: list[str], command: str
) -> str:
    """The soak's record, in markdown."""
    roles = Counter(f.role for f in disturbed.faults)
    spread = [f"{r.accuracy:.3f} (seed {r.seed}, {r.minutes:.1f} min)" for r in undisturbed]
    lines = [
        f"Command: `{command}` ({os.cpu_count()} CPU cores, "
        f"load {os.getloadavg()[0]:.1f} at the end)",
        "",
        f"- disturbed run (seed {disturbed.seed}): {len(disturbed.history)} steps in "
        f"{disturbed.minutes:.1f} min, {len(disturbed.faults)} workers SIGKILLed "
        f"({', '.join(f'{n} {r}' for r, n in sorted(roles.items()))}); "
        f"restarts {disturbed.counted('trainer/restarts'):.0f}, rollout replacements "
        f"{disturbed.counted('rollout/replaced_total'):.0f}",
        f"- final val/accuracy: {disturbed.accuracy:.3f} disturbed; undisturbed {', '.join(spread)}"
        if not math.isnan(disturbed.accuracy)
        else "- final val/accuracy: not measured (the run validates never: --short judges "
        "no accuracy)",
        f"- exactly-once: {len(disturbed.trained)} steps, each on the same prompts as the "
        "undisturbed run of the same seed"
        if not any("prompts" in p for p in problems)
        else "- exactly-once: FAILED",
        "- faults: "
        + "; ".join(f"{f.role} at step {f.step} ({f.seconds:.0f} s)" for f in disturbed.faults),
        f"- verdict: {'passed' if not problems else 'FAILED: ' + '; '.join(problems)}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the soak, print (and optionally record) its report; non-zero when it failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the soak")
    parser.add_argument("--kill-every", type=float, default=180.0, help="seconds between kills")
    parser.add_argument("--steps", type=int, default=None, help="default: fill --minutes")
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=3, help="undisturbed seeds for the spread")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--short", action="store_true", help="CI: 2 faults, 60 steps")
    parser.add_argument("--output", type=Path, help="record the report in this markdown file")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.short:
        args.steps, args.kill_every, args.seeds, args.tolerance = args.steps or 60, 8.0, 1, -1
        kills = 2
    else:
        kills = max(1, int(args.minutes * 60 // args.kill_every) - 1)
    steps = args.steps or int(args.minutes * 60 / STEP_SECONDS)
    workdir = Path(tempfile.mkdtemp(prefix="chaos-soak-"))
    extra = SHORT if args.short else ()
    disturbed = soak_run(
        workdir,
        "chaos",
        args.seed,
        steps,
        args.save_every,
        kills,
        args.kill_every,
        args.short,
        extra,
    )
    seeds = [args.seed, *range(args.seed + 1, args.seed + args.seeds)]
    undisturbed = [
        soak_run(workdir, f"calm{seed}", seed, steps, args.save_every, extra=extra)
        for seed in seeds
    ]
    problems = check(disturbed, undisturbed, kills, args.tolerance)
    command = "python tools/reliability/chaos_soak.py " + " ".join(argv or sys.argv[1:])
    text = report(disturbed, undisturbed, problems, command)
    print(text)
    if args.output is not None:
        document = args.output.read_text()
        head, rest = document.split(SOAK_START, 1)
        document = f"{head}{SOAK_START}\n{text}\n{SOAK_END}{rest.split(SOAK_END, 1)[1]}"
        args.output.write_text(document)
    (workdir / "soak.json").write_text(json.dumps({"problems": problems, "report": text}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
