"""Where HybridFlow's GRPO start-up goes: process start to the first GRPO step, by phase.

What it really is: the HybridFlow column of ``bench_grpo.py`` (:func:`bench_grpo.hybridflow_column`,
the quickstart recipe's GRPO stage) run for ``--steps`` steps in a fresh process, ``--repeats``
times. In that child process, the functions that start each phase are wrapped so that they
record wall-clock (``time.time()``) start and end marks; the parent notes the time just before
it spawns the child. Nothing is replaced: the wrapped functions run as they are.

Phases (seconds, median over the repeats):

* ``interpreter``: spawn to the child's first line (Python itself);
* ``imports``: the child's imports (torch, transformers, hf_algos, the recipe);
* ``tokenizer + data``: the benchmark's prompt files and config, tokenizer, training loader
  and validation set;
* ``reward set-up``: the reward manager (its scoring processes start in the background);
* ``ray start``: ``ensure_ray`` (a local Ray); since the start-early change Ray starts in a
  background thread first thing (as ``bench_grpo``'s column and the ``hybridflow`` command
  do), so this is the wait for it;
* ``worker groups``: pools reserved and the worker processes asked for (they start and
  import in the background while the driver loads its data);
* ``init_model``: the wait for the worker processes' start, then every role's model built;
* ``weights to rollout``: the first weight sync (``RoleGroups.sync_weights``);
* ``reward check (wait)``: waiting for the scoring process's check of one row, which ran
  in the background since ``reward set-up``;
* ``run dir + loggers``: the run directory, jsonl and TensorBoard writers;
* ``validation``: ``trainer.val_before_train`` (the plain loop also evaluates at step 0, so the
  comparison with it holds validation apart: see ``to first step w/o validation``);
* ``first step``: the first ``train_step``.

Usage (from the repository root, dev venv)::

    python tools/bench/bench_startup.py --repeats 3
    python tools/bench/bench_startup.py --repeats 3 --override grpo.trainer.backend=local
    python tools/bench/bench_startup.py --repeats 5 --backends ray,local  # side by side

``--backends`` runs one start-up per backend in each round (interleaved, so both see the
same load) and prints one table per backend.
"""

from __future__ import annotations

import time

CHILD_STARTED = time.time()  # before any other import: the end of the interpreter's start

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

PHASES: tuple[str, ...] = (
    "interpreter",
    "imports",
    "tokenizer + data",
    "reward set-up",
    "ray start",
    "worker groups",
    "init_model",
    "weights to rollout",
    "reward check (wait)",
    "run dir + loggers",
    "validation",
    "first step",
)
"""Phases in the order the start-up runs them."""

Marks = list[tuple[str, float, float]]
"""``(phase, start, end)`` wall-clock marks, in the order they were taken."""


def phase_seconds(spawned: float, marks: Marks) -> dict[str, float]:
    """Seconds per phase from the child's ``marks``; ``spawned`` is when the parent spawned it.

    Marks of the same phase add up; marks after the first step are left out; time between
    marks that no phase claims goes to the phase that follows it (so the phases sum to
    spawn -> end of the first step). Also
    ``total to first step``, ``to first step w/o validation`` and ``other`` (the unclaimed
    time, already counted in the phases).
    """
    seconds = dict.fromkeys(PHASES, 0.0)
    other = 0.0
    cursor = spawned
    step_end = max((end for name, _, end in marks if name == "first step"), default=math.inf)
    for name, start, end in sorted(marks, key=lambda mark: mark[1]):
        if start >= step_end:  # after the start-up (e.g. a later validation)
            continue
        gap = max(0.0, start - cursor)
        seconds[name] += gap + (end - start)
        other += gap if name not in ("interpreter", "imports") else 0.0
        cursor = max(cursor, end)
    seconds["total to first step"] = cursor - spawned
    seconds["to first step w/o validation"] = cursor - spawned - seconds["validation"]
    seconds["other"] = other
    return seconds


def _wrap(owner: Any, attribute: str, phase: str, marks: Marks, once: bool = False) -> None:
    """Replace ``owner.attribute`` with a wrapper that marks ``phase`` around each call."""
    original: Callable[..., Any] = getattr(owner, attribute)
    done = [False]

    def timed(*args: Any, **kwargs: Any) -> Any:
        if once and done[0]:
            return original(*args, **kwargs)
        done[0] = True
        start = time.time()
        try:
            return original(*args, **kwargs)
        finally:
            marks.append((phase, start, time.time()))

    setattr(owner, attribute, timed)


def _wrap_check(cls: Any, marks: Marks) -> None:
    """Mark the wait for ``cls.check_async``'s future (the check itself runs meanwhile)."""
    original = cls.check_async

    def check_async(self: Any, rows: Any) -> Any:
        future = original(self, rows)
        result = future.result

        def timed_result(timeout: float | None = None) -> Any:
            start = time.time()
            try:
                return result(timeout)
            finally:
                marks.append(("reward check (wait)", start, time.time()))

        future.result = timed_result
        return future

    cls.check_async = check_async


class FirstStepDoneError(BaseException):
    """Raised after the first step: the start-up is measured, the run need not go on (a
    ``BaseException``, so that the ``hybridflow`` command's error handler lets it through)."""


def _install_wrappers(marks: Marks) -> None:
    """Import the trainer modules and wrap the functions that start each phase."""
    from hf_algos.rewards import manager
    from hf_algos.trainers.lifecycle import trainer as base
    from hf_algos.trainers.ppo import trainer as ppo
    from hf_algos.trainers.roles import groups as roles

    for name in ("load_tokenizer", "rl_loader", "val_dataset"):  # as ppo.py names them
        _wrap(ppo, name, "tokenizer + data", marks)
    _wrap(manager.RewardManager, "from_config", "reward set-up", marks)
    if hasattr(manager.RewardManager, "check_async"):  # not before the start-up work
        _wrap_check(manager.RewardManager, marks)
    _wrap(roles, "ensure_ray", "ray start", marks)
    _wrap(roles, "make_worker_group", "worker groups", marks)
    _wrap(roles.RoleGroups, "init_models", "init_model", marks)
    _wrap(roles.RoleGroups, "sync_weights", "weights to rollout", marks, once=True)
    _wrap(base.Trainer, "_open_run", "run dir + loggers", marks)
    _wrap(base.Trainer, "_validate", "validation", marks, once=True)
    original_step = ppo.PPOTrainer.train_step

    def first_step(self: Any, prompts: Any) -> Any:
        start = time.time()
        original_step(self, prompts)
        marks.append(("first step", start, time.time()))
        raise FirstStepDoneError

    ppo.PPOTrainer.train_step = first_step  # type: ignore[method-assign]


def child(argv: list[str]) -> int:
    """One measured start-up (the child process): writes its marks as JSON to ``--marks``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--init", type=Path, help="the bench entry's model folder")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--marks", type=Path, required=True)
    parser.add_argument("--override", action="append", default=[])
    parser.add_argument("--entry", choices=("bench", "cli"), default="bench")
    args = parser.parse_args(argv)
    marks: Marks = [("interpreter", CHILD_STARTED, CHILD_STARTED)]
    imported = time.time()
    if args.entry == "cli":
        return cli_child(args, marks, imported)
    if "grpo.trainer.backend=local" not in args.override:
        # As bench_grpo's column (and the `hybridflow` command) do first: Ray starts in the
        # background while torch imports; "ray start" is then the wait for it.
        from hf_controller import start_ray_in_background

        start_ray_in_background()
    sys.path.insert(0, str(HERE))
    import bench_grpo

    _install_wrappers(marks)
    marks.append(("imports", imported, time.time()))
    column = [
        f"--init={args.init}",
        f"--result={args.workdir / 'unused.json'}",
        f"--workdir={args.workdir}",
        "--max-steps=2",
        "--eval-every=25",
        "--threads=2",
        "--seed=2",
        *(f"--override={o}" for o in args.override),
    ]
    with contextlib.suppress(FirstStepDoneError):
        bench_grpo.hybridflow_column(column)
    args.marks.write_text(json.dumps(marks))
    return 0


def cli_args(workdir: Path, overrides: list[str]) -> list[str]:
    """``hybridflow`` arguments: the packaged quickstart config, its model and data in
    ``workdir`` (made by the config's resolvers on first use), validation before step 1.
    ``overrides`` are ``grpo.``-prefixed (the recipe's spelling), as the bench entry's."""
    return [
        "grpo",
        "--config-name",
        "quickstart",
        f"vars.workdir={workdir}",
        "trainer.total_training_steps=2",
        "trainer.progress_bar=false",
        "trainer.val_before_train=true",
        "trainer.test_freq=0",
        "trainer.loggers=[jsonl]",
        *(o.removeprefix("grpo.") for o in overrides),
    ]


_MAKE_ASSETS = """
import importlib, sys
from hf_algos.config.loading import resolve_config
from hf_algos.examples import register_resolvers
cli = importlib.import_module("hf_algos.cli.main")
args = cli.parse_arguments(cli.build_parser(), sys.argv[1:])
register_resolvers()
resolve_config(cli.compose_command_config(cli.COMMANDS[args.command], args))
"""
"""Resolve a ``hybridflow`` command's config outside ``requested_assets``: its packaged
example's files are made as they resolve."""


def prepare_cli_workdir(workdir: Path) -> None:
    """Make the packaged config's task model, data and warmed-up model in ``workdir`` (the
    resolvers, outside the command's ``requested_assets`` scope, make their files as they
    resolve), so that no measured start-up pays for them. ``--cfg`` would not: it only
    names them (a one-time supervised warm-up of ~10-20 s here)."""
    command = [sys.executable, "-c", _MAKE_ASSETS, *cli_args(workdir, [])[:4]]
    subprocess.run(command, capture_output=True, check=True, cwd=workdir, timeout=300)


def cli_child(args: argparse.Namespace, marks: Marks, imported: float) -> int:
    """The ``hybridflow grpo --config-name quickstart`` command in this process: ``imports``
    runs from here to the trainer's modules imported (the config composed and checked, Ray
    and the worker processes started early in the background, torch imported)."""
    # the module (the package's ``main`` attribute is the entry function of the same name)
    cli = importlib.import_module("hf_algos.cli.main")
    original_train = cli.train

    def train(command: Any, config: Any) -> None:
        _install_wrappers(marks)
        marks.append(("imports", imported, time.time()))
        original_train(command, config)

    cli.train = train  # type: ignore[attr-defined]
    with contextlib.suppress(FirstStepDoneError):
        code = cli.main(cli_args(args.workdir, args.override))
        raise SystemExit(f"hybridflow ended ({code}) before its first step")
    args.marks.write_text(json.dumps(marks))
    return 0


def run_once(
    init: Path | None, workdir: Path, overrides: list[str], entry: str = "bench"
) -> dict[str, float]:
    """Spawn one child, return its phase seconds."""
    from bench_support import column_env

    marks_file = workdir / "marks.json"
    command = [sys.executable, str(Path(__file__).resolve()), "child"]
    command += [f"--init={init}"] if init is not None else []
    command += [f"--workdir={workdir}", f"--marks={marks_file}", f"--entry={entry}"]
    command += [f"--override={o}" for o in overrides]
    log = workdir / "child.log"
    with log.open("w") as handle:
        spawned = time.time()
        proc = subprocess.run(
            command, stdout=handle, stderr=subprocess.STDOUT, env=column_env(2), cwd=ROOT
        )
    if proc.returncode != 0:
        raise SystemExit(f"start-up run failed (exit {proc.returncode}); log {log}:\n"
                         + log.read_text(errors="replace")[-3000:])  # fmt: skip
    return phase_seconds(spawned, [tuple(m) for m in json.loads(marks_file.read_text())])


def table(runs: list[dict[str, float]]) -> str:
    """Markdown table: each phase's median and range over ``runs``."""
    lines = ["| phase | s (median) | min | max |", "|---|---:|---:|---:|"]
    for name in runs[0]:
        values = [run[name] for run in runs]
        lines.append(
            f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |"
        )
    return "\n".join(lines)


def side_by_side(runs: dict[str, list[dict[str, float]]]) -> str:
    """Markdown table: each phase's median per backend (columns in ``runs``' order)."""
    names = list(runs)
    lines = [
        "| phase | " + " | ".join(f"{name} s (median)" for name in names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for phase in runs[names[0]][0]:
        medians = [statistics.median(run[phase] for run in runs[name]) for name in names]
        lines.append(f"| {phase} | " + " | ".join(f"{m:.2f}" for m in medians) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: build the task model, measure ``--repeats`` start-ups, print the table."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "child":
        return child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--init", type=Path, help="model folder (default: a fresh task model)")
    parser.add_argument("--workdir", type=Path, help="keep logs here")
    parser.add_argument(
        "--override", action="append", default=[], help="recipe key=value, e.g. grpo.trainer..."
    )
    parser.add_argument(
        "--backends",
        default="",
        help="comma-separated trainer.backend values run side by side (e.g. ray,local)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME or NAME=KEY=VALUE[,KEY=VALUE]: a column with these extra recipe overrides "
        "(repeat for side-by-side columns, interleaved like --backends)",
    )
    parser.add_argument(
        "--entry",
        choices=("bench", "cli"),
        default="bench",
        help="bench: bench_grpo's HybridFlow column; cli: `hybridflow grpo --config-name "
        "quickstart` (the packaged config: 16 prompts x 16 samples a step)",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-startup-"))
    workdir.mkdir(parents=True, exist_ok=True)
    init = args.init
    # start-up does not depend on the weights: an untrained model will do (the cli entry's
    # config makes its own model)
    if init is None and args.entry == "bench":
        import grpo_task

        init = grpo_task.build_task_model(workdir / "model")
    load_before = os.getloadavg()[0]
    variants = {
        name: [*args.override, f"grpo.trainer.backend={name}"]
        for name in args.backends.split(",")
        if name
    }
    for variant in args.variant:
        name, _, extra = variant.partition("=")
        variants[name] = [*args.override, *(o for o in extra.split(",") if o)]
    variants = variants or {"": list(args.override)}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for repeat in range(args.repeats):
        for name, overrides in variants.items():  # interleaved: each round sees the same load
            run_dir = workdir / f"run{repeat}{'-' + name if name else ''}"
            run_dir.mkdir(exist_ok=True)
            if args.entry == "cli":  # the config's resolvers make the data once, untimed
                prepare_cli_workdir(run_dir)
            runs[name].append(run_once(init, run_dir, overrides, args.entry))
            total = runs[name][-1]["total to first step"]
            print(f"repeat {repeat + 1}/{args.repeats} {name}: {total:.2f} s to the first step")
    from bench_support import machine_line

    print(
        f"\nMeasured on {machine_line(['torch', 'transformers', 'ray'])}; load average (1 min) "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after; overrides "
        f"{' '.join(args.override) or 'none'}; {args.repeats} repeats.\n"
    )
    if len(variants) > 1:
        print(side_by_side(runs) + "\n")
    for name, backend_runs in runs.items():
        if name:
            print(f"{name} ({' '.join(variants[name]) or 'no overrides'}):\n")
        print(table(backend_runs) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
