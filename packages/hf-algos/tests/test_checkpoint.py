"""Checkpoint manager: layout, latest marker, pruning, RNG round trip, partial saves, safe
loading, and a real driver SIGKILLed at several points of a save."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_algos.checkpoint import (
    KILL_AT_ENV,
    LATEST_FILE,
    STATE_FILE,
    TMP_PREFIX,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
)
from hf_engines.checkpointing import UnsafeCheckpointError


class LinearRole:
    """A real model + optimizer that saves and loads like a worker group's role."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Linear(3, 2)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.1)

    def train_step(self) -> None:
        loss = self.model(torch.ones(1, 3)).pow(2).sum()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()

    def save_checkpoint(self, path: str) -> None:
        Path(path).mkdir(parents=True)
        torch.save(
            {"model": self.model.state_dict(), "optim": self.optimizer.state_dict()},
            Path(path) / "state.pt",
        )

    def load_checkpoint(self, path: str) -> None:
        state = torch.load(Path(path) / "state.pt")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])


def test_save_load_resume_exactly(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, max_checkpoints=2)
    assert manager.latest() is None
    role = LinearRole(seed=0)
    for step in range(1, 4):
        role.train_step()
        manager.save(
            step,
            {"loader": {"epoch": 0, "index": step}, "rng": capture_rng_state()},
            {"actor": role},
        )
    assert [p.name for p in manager.checkpoints()] == ["global_step_2", "global_step_3"]
    assert (tmp_path / LATEST_FILE).read_text() == "3"
    latest = manager.latest()
    assert latest == tmp_path / "global_step_3"
    expected_rng = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    role.train_step()
    expected = role.model.weight.detach().clone()

    fresh = LinearRole(seed=1)
    random.seed(99)
    state = manager.load(latest, {"actor": fresh})
    restore_rng_state(state["rng"])
    assert state["global_step"] == 3 and state["loader"] == {"epoch": 0, "index": 3}
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected_rng
    fresh.train_step()
    torch.testing.assert_close(fresh.model.weight, expected, rtol=0, atol=0)


def test_incomplete_checkpoints_are_not_latest(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, {})
    (tmp_path / "global_step_2" / "actor").mkdir(parents=True)  # a save killed midway
    assert manager.latest() == tmp_path / "global_step_1"
    assert [p.name for p in manager.checkpoints()] == ["global_step_1"]
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        manager.load(tmp_path / "global_step_2")
    with pytest.raises(FileNotFoundError, match="has no 'critic' state"):
        manager.load(tmp_path / "global_step_1", {"critic": LinearRole(0)})
    with pytest.raises(ValueError, match="max_checkpoints"):
        CheckpointManager(tmp_path, max_checkpoints=0)


def test_stale_temporaries_go_and_pruning_keeps_the_latest(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, max_checkpoints=1)
    (tmp_path / ".tmp-global_step_7-dead").mkdir()  # a save killed midway
    (tmp_path / "global_step_9" / "actor").mkdir(parents=True)  # an old-style partial save
    manager.save(1, {}, {"actor": LinearRole(0)})
    assert not (tmp_path / ".tmp-global_step_7-dead").exists()
    manager.save(2, {}, {"actor": LinearRole(0)})
    # the incomplete global_step_9 neither counts towards max_checkpoints nor becomes latest
    assert [p.name for p in manager.checkpoints()] == ["global_step_2"]
    assert manager.latest() == tmp_path / "global_step_2"
    # a pointer naming a vanished checkpoint falls back to the newest complete one
    (tmp_path / LATEST_FILE).write_text("5")
    assert manager.latest() == tmp_path / "global_step_2"


class _RunsCodeOnLoad:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned",))


def test_trainer_state_with_pickled_code_is_refused(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    directory = manager.save(1, {"rng": capture_rng_state(), "loader": {"index": 1}})
    assert manager.load(directory)["loader"] == {"index": 1}
    torch.save({"global_step": 1, "payload": _RunsCodeOnLoad()}, directory / STATE_FILE)
    with pytest.raises(UnsafeCheckpointError, match=r"trainer_state\.pt.*system"):
        manager.load(directory)


DRIVER = Path(__file__).with_name("crash_driver.py")


def _drive(model: Path, root: Path, steps: int, kill_at: str | None) -> int:
    """Run the crash driver to the end or to its SIGKILL; return its exit code."""
    env = {k: v for k, v in os.environ.items() if k != KILL_AT_ENV}
    if kill_at is not None:
        env[KILL_AT_ENV] = kill_at
    command = [sys.executable, str(DRIVER), str(model), str(root), str(steps)]
    return subprocess.run(command, env=env, capture_output=True, timeout=300).returncode


@pytest.mark.timeout(600)
def test_driver_killed_during_saves_resumes_from_the_previous_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """SIGKILL a real driver at several points of a save; each next run resumes from the
    checkpoint before it (a run killed later in a save of the same step included)."""
    manager = CheckpointManager(tmp_path / "ckpt")
    for kill_at, expected_latest, resumed_from in (
        ("role:actor@2", "global_step_1", None),  # the actor wrote its part, nothing else
        ("renamed@2", "global_step_1", "global_step_1"),  # complete, but not yet `latest`
        ("state@3", "global_step_2", "global_step_1"),  # step 2 re-saved over its old dir
    ):
        assert _drive(tiny_model_dir, tmp_path, 3, kill_at) == -signal.SIGKILL, kill_at
        assert json.loads((tmp_path / "started.json").read_text()) == resumed_from
        latest = manager.latest()
        assert latest is not None and latest.name == expected_latest, kill_at
    assert any(p.name.startswith(TMP_PREFIX) for p in manager.root.iterdir())
    assert _drive(tiny_model_dir, tmp_path, 3, None) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["resumed_from"] == "global_step_2" and len(result["history"]) == 1
    assert [p.name for p in manager.checkpoints()] == [f"global_step_{k}" for k in (1, 2, 3)]
    assert not any(p.name.startswith(TMP_PREFIX) for p in manager.root.iterdir())
