"""A run owns its directories: locks, per-experiment defaults, resume identity, writability
checked before Ray starts, and the lines that say what is saved and where.

The command tests run the real ``hybridflow grpo`` on a tiny random model in a directory of
their own (``trainer.backend=local``, one to three steps).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf_algos.examples.reverse_letters import ModelShape, build_model_dir
from hf_algos.run_dirs import check_writable
from hf_algos.run_lock import LOCK_FILE, RunDirectoryInUseError, lock_run_directory
from hf_controller import ConfigurationError

from .test_cli import FAST, _task, hybridflow

HOLD_LOCK = """
import sys, time
from hf_algos.run_lock import lock_run_directory
lock_run_directory(sys.argv[1], "trainer.checkpoint_dir")
print("held", flush=True)
time.sleep(60)
"""


def grpo_overrides(task: Path, steps: int, *extra: str) -> list[str]:
    """A tiny GRPO run on ``_task(task)``'s model, data and reward, logging under task/logs."""
    model, data, reward = task / "model", task / "train.jsonl", task / "my_reward.py"
    return [
        f"actor.engine.model.path={model}",
        f"data.train_files=[{data}]",
        f"reward.function_path={reward}",
        "data.train_batch_size=4",
        "data.max_prompt_length=4",
        "rollout.n=2",
        "rollout.max_new_tokens=4",
        "actor.ppo_mini_batch_size=8",
        f"trainer.total_training_steps={steps}",
        "trainer.log_dir=logs",
        *FAST,
        *extra,
    ]


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model, data and reward file, made once for the module."""
    root = tmp_path_factory.mktemp("task")
    _task(root)
    return root


def test_a_held_directory_is_refused_naming_the_holder_and_a_stale_lock_taken_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path / "ckpt")], stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        with pytest.raises(RunDirectoryInUseError) as refused:
            lock_run_directory(tmp_path / "ckpt", "trainer.checkpoint_dir")
        message = str(refused.value)
        assert f"pid {holder.pid} on host {socket.gethostname()}, started " in message
        assert "trainer.checkpoint_dir=" in message and "\n" not in message
    finally:
        holder.kill()
        holder.wait()
    # the holder died without releasing: its file is left, its flock is gone
    assert json.loads((tmp_path / "ckpt" / LOCK_FILE).read_text())["pid"] == holder.pid
    lock = lock_run_directory(tmp_path / "ckpt", "trainer.checkpoint_dir")
    assert f"taking over the lock left by a run that is gone (pid {holder.pid}" in (
        capsys.readouterr().err
    )
    assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    again = lock_run_directory(tmp_path / "ckpt", "trainer.checkpoint_dir")  # same process
    assert again is lock
    again.release()
    assert lock.path.exists()
    lock.release()
    assert not lock.path.exists()


def test_unwritable_directories_are_refused_before_anything_starts(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigurationError, match=r"trainer.log_dir='.*a_file/sub' is not writ"):
        check_writable("trainer.log_dir", blocker / "sub")
    check_writable("trainer.log_dir", tmp_path / "new" / "deeper")  # creatable: fine
    assert not (tmp_path / "new").exists() and sorted(os.listdir(tmp_path)) == ["a_file"]
    if os.geteuid() != 0:  # root writes through a 0o500 directory
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ConfigurationError, match=r"PermissionError"):
            check_writable("trainer.export_dir", locked / "model")


@pytest.mark.parametrize("key", ["export_dir", "checkpoint_dir", "log_dir"])
def test_the_command_refuses_an_unwritable_output_in_one_line(
    task: Path, tmp_path: Path, key: str
) -> None:
    (tmp_path / "a_file").write_text("")
    started = time.monotonic()
    run = hybridflow("grpo", *grpo_overrides(task, 2, f"trainer.{key}=a_file/sub"), cwd=tmp_path)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and f"trainer.{key}='a_file/sub' is not writable" in lines[0]
    assert "run " not in run.stdout and time.monotonic() - started < 60


def test_two_runs_on_one_checkpoint_directory(task: Path, tmp_path: Path) -> None:
    """The second run is refused at once, naming the first; the first's checkpoints are
    all its own."""
    overrides = grpo_overrides(task, 3, "trainer.checkpoint_dir=ckpt", "trainer.save_freq=1")
    first = subprocess.Popen(
        [sys.executable, "-m", "hf_algos", "grpo", *overrides],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ckpt" / LOCK_FILE).exists() and first.poll() is None:
            assert time.monotonic() < deadline, "the first run never locked its directory"
            time.sleep(0.1)
        second = hybridflow("grpo", *overrides, cwd=tmp_path)
        out, err = first.communicate(timeout=240)
    finally:
        first.kill()
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert f"is in use by another run (pid {first.pid} on host " in second.stderr
    assert first.returncode == 0, out[-2000:] + err[-2000:]
    steps = sorted((tmp_path / "ckpt").glob("global_step_*"))
    assert [p.name for p in steps] == ["global_step_1", "global_step_2", "global_step_3"]
    run_ids = {json.loads((p / "trainer_state.json").read_text())["run_id"] for p in steps}
    assert len(run_ids) == 1 and not (tmp_path / "ckpt" / LOCK_FILE).exists()


def test_defaults_are_per_experiment_and_the_run_says_what_it_keeps(
    task: Path, tmp_path: Path
) -> None:
    first = hybridflow("grpo", *grpo_overrides(task, 1, "trainer.experiment_name=a"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = tmp_path / "outputs" / "hybridflow" / "a" / "checkpoints" / "global_step_1"
    assert (saved / "run_identity.json").is_file()  # saved at the end by default
    last = first.stdout.strip().splitlines()[-1]
    assert last.startswith(f"hybridflow: checkpoint: {saved}; model export: none")
    assert "; logs: " in last and "nothing of this run will be saved" not in first.stdout
    second = hybridflow(
        "grpo",
        *grpo_overrides(task, 1, "trainer.experiment_name=b", "trainer.save_final=false"),
        cwd=tmp_path,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed" not in second.stdout  # another experiment starts fresh
    assert "hybridflow: nothing of this run will be saved (trainer.save_freq=0" in second.stdout
    assert "hybridflow: checkpoint: none saved; model export: none" in second.stdout
    assert not list((tmp_path / "outputs" / "hybridflow" / "b" / "checkpoints").glob("global_*"))
    again = hybridflow("grpo", *grpo_overrides(task, 1, "trainer.experiment_name=a"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]  # the same job again: said, not silent
    assert f"the checkpoint in {saved.parent} is at step 1 of 1: nothing left to train" in (
        again.stdout
    )


def test_resume_refuses_another_jobs_checkpoint_unless_forced(task: Path, tmp_path: Path) -> None:
    first = hybridflow(
        "grpo", *grpo_overrides(task, 1, "trainer.checkpoint_dir=shared"), cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr[-3000:]
    wider = ModelShape(
        hidden_size=48, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    other_model = build_model_dir(tmp_path / "other", wider, seed=0)
    cases = {
        "its experiment is 'hybridflow/run', this run's is 'hybridflow/b'": [
            "trainer.experiment_name=b"
        ],
        f"its model (config.json hash) is '{task / 'model'} (": [
            f"actor.engine.model.path={other_model}"
        ],
    }
    for message, extra in cases.items():
        run = hybridflow(
            "grpo",
            *grpo_overrides(task, 2, "trainer.checkpoint_dir=shared", *extra),
            cwd=tmp_path,
        )
        assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], run.stderr
        assert "set trainer.resume_force=true" in lines[0] and "run " not in run.stdout
    forced = hybridflow(
        "grpo",
        *grpo_overrides(
            task,
            2,
            "trainer.checkpoint_dir=shared",
            "trainer.experiment_name=b",
            "trainer.resume_force=true",
        ),
        cwd=tmp_path,
    )
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert "(resumed at step 1)" in forced.stdout
    assert (tmp_path / "shared" / "global_step_2").is_dir()
