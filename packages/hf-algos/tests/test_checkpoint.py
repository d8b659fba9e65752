"""Checkpoint manager: layout, latest marker, pruning, RNG round trip, partial saves."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_algos.checkpoint import (
    LATEST_FILE,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
)


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
    manager = CheckpointManager(tmp_path, max_to_keep=2)
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
    with pytest.raises(ValueError, match="max_to_keep"):
        CheckpointManager(tmp_path, max_to_keep=0)
