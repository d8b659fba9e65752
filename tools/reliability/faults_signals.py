"""Fault cases of signals: the ``hybridflow`` driver stopped by SIGTERM, as a scheduler's
preemption, ``kill`` or ``docker stop`` stops it.

A real ``hybridflow grpo`` run on Ray (a tiny random model, the reverse-letters task, a
checkpoint every step) in a session of its own, signalled once its first step is logged.
Measured: the time from the signal to the driver's exit, and the processes of the run
(Ray's GCS, raylet and agents, the workers, the reward's processes) still alive after it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from faults import FaultCase, FaultResult, first_line, stopwatch, tiny_grpo_task

LEFTOVER_WAIT_S = 10.0
"""How long after the driver's exit its processes may take to end."""


def _start_run(scratch: Path) -> subprocess.Popen[str]:
    """``hybridflow grpo`` for 1000 steps in ``scratch``, in a new session."""
    overrides = [
        *tiny_grpo_task(scratch), "data.train_batch_size=4",
        "data.max_prompt_length=4", "rollout.n=4", "rollout.max_new_tokens=4",
        "actor.ppo_mini_batch_size=16", "trainer.total_training_steps=1000",
        "trainer.loggers=[jsonl]", "trainer.log_dir=logs", "trainer.checkpoint_dir=ckpt",
        "trainer.save_freq=1", "trainer.progress_bar=false", "reward.num_workers=1",
    ]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "hf_algos", "grpo", *overrides],
        cwd=scratch,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _session_processes(session: int) -> list[str]:
    """Live processes of ``session`` (the run's pid: it leads its session)."""
    found = []
    for process in psutil.process_iter(["pid", "name"]):
        try:
            if os.getsid(process.pid) == session and process.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{process.pid} {process.name()}")
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def _wait_for_first_step(run: subprocess.Popen[str], logs: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(p.read_text().strip() for p in logs.rglob("metrics.jsonl")):
        assert run.poll() is None, f"the run ended early: {run.communicate()[0][-2000:]}"
        assert time.monotonic() < deadline, f"no step logged within {timeout_s} s"
        time.sleep(0.2)


def sigterm_to_the_driver(scratch: Path) -> FaultResult:
    """SIGTERM the driver after its first step: exit 143 with one line of ours, no
    traceback, no Ray ``*** SIGTERM received``, and none of its processes left."""
    run = _start_run(scratch)
    try:
        _wait_for_first_step(run, scratch / "logs", timeout_s=240)
        started = len(_session_processes(run.pid)) - 1
        with stopwatch() as elapsed:
            run.send_signal(signal.SIGTERM)
            output, _ = run.communicate(timeout=120)
            seconds = elapsed()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 143, f"exit {run.returncode}: {output[-2000:]}"
    ours = [line for line in output.splitlines() if line.startswith("hybridflow grpo: ")]
    assert len(ours) == 1 and "terminated (SIGTERM) at step" in ours[0], output[-2000:]
    assert "Traceback" not in output and "*** SIGTERM received" not in output, output[-2000:]
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    left = _session_processes(run.pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _session_processes(run.pid)
    assert not left, f"{len(left)} processes of the run left {LEFTOVER_WAIT_S:g} s after: {left}"
    return FaultResult(
        "named error",
        seconds,
        "the step in progress (save_freq=1)",
        first_line(f"exit 143, 0 of its {started} processes left; {ours[0]}"),
    )


FAULTS = [FaultCase("SIGTERM to the driver", sigterm_to_the_driver)]
