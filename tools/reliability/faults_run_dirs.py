"""Fault cases of run directories: two runs on one checkpoint directory, an unwritable
output directory, another experiment's checkpoint in the directory a run resumes from.

Each runs the real ``hybridflow grpo`` command in a subprocess (``trainer.backend=local``)
on a tiny random Llama with the reversed-letters task and a reward file, as a user runs it,
and times the command until its one-line message.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from faults import FaultCase, FaultResult, first_line, stopwatch, tiny_grpo_task


def _task(scratch: Path) -> list[str]:
    """A tiny model, 16 rows and a reward file in ``scratch``: the overrides of a run."""
    return [
        *tiny_grpo_task(scratch),
        "data.train_batch_size=4",
        "data.max_prompt_length=4",
        "rollout.n=2",
        "rollout.max_new_tokens=4",
        "actor.ppo_mini_batch_size=8",
        "trainer.backend=local",
        "trainer.progress_bar=false",
        "trainer.log_dir=logs",
        "reward.num_workers=1",
    ]


def _command(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "hf_algos", "grpo", *overrides]


def _refused(scratch: Path, *overrides: str) -> tuple[float, str]:
    """Run the command, which must stop with exit 2 and one line; its seconds and line."""
    with stopwatch() as elapsed:
        run = subprocess.run(
            _command(*overrides), cwd=scratch, capture_output=True, text=True, timeout=300
        )
        seconds = elapsed()
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2, f"exit {run.returncode}: {run.stderr[-2000:]}"
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "run " not in run.stdout, "the run started before the refusal"
    return seconds, lines[0]


def two_runs_on_one_directory(scratch: Path) -> FaultResult:
    """Start a second run on the checkpoint directory of a running one: refused at once,
    naming the first, whose three checkpoints are all its own."""
    base = [*_task(scratch), "trainer.checkpoint_dir=ckpt", "trainer.save_freq=1"]
    first = subprocess.Popen(
        _command(*base, "trainer.total_training_steps=3"),
        cwd=scratch,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (scratch / "ckpt" / ".hybridflow.lock").exists():
            assert first.poll() is None and time.monotonic() < deadline, "no lock taken"
            time.sleep(0.1)
        seconds, line = _refused(scratch, *base, "trainer.total_training_steps=3")
        _, err = first.communicate(timeout=300)
    finally:
        first.kill()
    assert f"in use by another run (pid {first.pid} " in line, line
    assert first.returncode == 0, f"the first run failed: {err[-2000:]}"
    steps = sorted(p.name for p in (scratch / "ckpt").glob("global_step_*"))
    assert steps == ["global_step_1", "global_step_2", "global_step_3"], steps
    return FaultResult("named error", seconds, "nothing (refused before Ray)", first_line(line))


def unwritable_output(scratch: Path) -> FaultResult:
    """``trainer.export_dir`` under a regular file (unwritable for root too): refused by
    the config checks, before Ray starts and any step."""
    (scratch / "a_file").write_text("")
    seconds, line = _refused(
        scratch, *_task(scratch), "trainer.total_training_steps=2", "trainer.export_dir=a_file/m"
    )
    assert "trainer.export_dir='a_file/m' is not writable" in line, line
    return FaultResult("named error", seconds, "nothing (before any step)", first_line(line))


def experiment_mix_up(scratch: Path) -> FaultResult:
    """A second experiment pointed at the first's checkpoint directory: its resume is
    refused, naming both experiments and ``trainer.resume_force``."""
    base = [*_task(scratch), "trainer.checkpoint_dir=shared"]
    done = subprocess.run(
        _command(*base, "trainer.total_training_steps=1", "trainer.experiment_name=a"),
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seconds, line = _refused(
        scratch, *base, "trainer.total_training_steps=2", "trainer.experiment_name=b"
    )
    assert "its experiment is 'hybridflow/a', this run's is 'hybridflow/b'" in line, line
    return FaultResult("named error", seconds, "nothing (before any step)", first_line(line))


FAULTS = [
    FaultCase("two runs on one checkpoint directory", two_runs_on_one_directory),
    FaultCase("unwritable output directory", unwritable_output),
    FaultCase("another experiment's checkpoint (mix-up)", experiment_mix_up),
]
