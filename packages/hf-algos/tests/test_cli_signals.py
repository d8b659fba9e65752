"""The ``hybridflow`` command stopped by a signal, as a scheduler or a user stops it: a real
``hybridflow grpo`` subprocess on a tiny model, signalled once its first step is logged.

SIGTERM and Ctrl-C (SIGINT) end it the same clean way: one line of ours that names the
signal and the step, no traceback, exit 128 + signal, and no process of the run (Ray's
GCS, raylet and agents, the workers, the reward's processes) left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from .test_cli import SCRIPT, _task

pytestmark = pytest.mark.timeout(300)


def _start_long_run(tmp_path: Path, backend: str) -> subprocess.Popen[str]:
    """A GRPO run of 1000 steps in a session of its own (every process it starts is in it)."""
    model, data, reward = _task(tmp_path)
    command = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "hf_algos"]
    overrides = [
        f"actor.engine.model.path={model}",
        f"data.train_files=[{data}]",
        f"reward.function_path={reward}",
        "data.train_batch_size=4",
        "data.max_prompt_length=4",
        "rollout.n=4",
        "rollout.max_new_tokens=4",
        "actor.ppo_mini_batch_size=16",
        "trainer.total_training_steps=1000",
        "trainer.loggers=[jsonl]",
        "trainer.log_dir=logs",
        "trainer.checkpoint_dir=ckpt",
        "trainer.save_freq=1",
        "trainer.progress_bar=false",
        "reward.num_workers=1",
        f"trainer.backend={backend}",
    ]
    return subprocess.Popen(
        [*command, "grpo", *overrides],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for_first_step(run: subprocess.Popen[str], log_dir: Path, timeout_s: float) -> None:
    """Return once the run has logged a step to its ``metrics.jsonl``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logged = [p for p in log_dir.rglob("metrics.jsonl") if p.read_text().strip()]
        if logged:
            return
        assert run.poll() is None, f"the run ended early: {run.communicate()[0][-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no step logged within {timeout_s} s")


def processes_of_session(session: int) -> list[str]:
    """The live processes of ``session`` (a ``start_new_session`` run's pid), as text."""
    found = []
    for process in psutil.process_iter(["pid", "name", "status"]):
        try:
            if os.getsid(process.pid) == session and process.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{process.pid} {process.name()}")
        except (ProcessLookupError, psutil.Error):
            continue  # ended meanwhile
    return found


def wait_until_gone(session: int, timeout_s: float) -> list[str]:
    """The processes of ``session`` still alive after up to ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    left = processes_of_session(session)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = processes_of_session(session)
    return left


@pytest.mark.parametrize(
    ("signum", "backend", "said"),
    [
        (signal.SIGTERM, "ray", "terminated (SIGTERM)"),
        (signal.SIGINT, "local", "interrupted (Ctrl-C)"),
    ],
)
def test_a_signal_stops_the_run_cleanly_with_one_line(
    tmp_path: Path, signum: int, backend: str, said: str
) -> None:
    run = _start_long_run(tmp_path, backend)
    try:
        wait_for_first_step(run, tmp_path / "logs", timeout_s=180)
        assert processes_of_session(run.pid)[1:], "the run started no process of its own"
        run.send_signal(signum)
        output, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 128 + signum, output[-3000:]
    ours = [line for line in output.splitlines() if line.startswith("hybridflow grpo: ")]
    assert len(ours) == 1 and said in ours[0], output[-3000:]
    assert (
        " at step " in ours[0] and f"last checkpoint {tmp_path / 'ckpt'}/global_step_" in ours[0]
    ), ours[0]
    assert "Traceback" not in output, output[-3000:]
    assert "*** SIGTERM received" not in output, output[-3000:]  # Ray's C++ handler
    # and none of the noise of a normal run's start: Ray's warning, the workers' loading bars
    assert "SIGTERM handler is not set" not in output and "Loading weights" not in output
    left = wait_until_gone(run.pid, timeout_s=10)
    assert not left, f"processes of the run left 10 s after its exit: {left}"
