"""Trainer checkpoints: worker state (actor, critic) plus the driver's own state.

A checkpoint is a directory ``<root>/global_step_<k>/`` with one sub-directory per worker
role (written by the role's ``save_checkpoint``), ``trainer_state.pt`` (data-loader
position, RNG states, KL controller, anything else the trainer hands in) and a readable
``trainer_state.json`` summary. ``<root>/latest_checkpointed_iteration.txt`` names the last
*complete* checkpoint: it is written only after everything else, so a run killed while
saving resumes from the previous one.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

LATEST_FILE = "latest_checkpointed_iteration.txt"
"""Name of the file holding the step of the newest complete checkpoint."""
STATE_FILE = "trainer_state.pt"
"""The driver's state inside a checkpoint directory."""
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class Checkpointable(Protocol):
    """A worker group (or anything) that saves to and loads from a directory."""

    def save_checkpoint(self, path: str) -> Any:
        """Write the state to ``path``."""
        ...

    def load_checkpoint(self, path: str) -> Any:
        """Restore the state from ``path``."""
        ...


def capture_rng_state() -> dict[str, Any]:
    """The driver process's Python, NumPy and torch (CPU) RNG states, as plain data."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return {
        "python": random.getstate(),
        "numpy": [kind, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(gauss)],
        "torch": torch.get_rng_state(),
    }


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Restore :func:`capture_rng_state`'s output."""
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])


class CheckpointManager:
    """Saves and finds checkpoints under ``root``; keeps at most ``max_to_keep`` of them."""

    def __init__(self, root: str | PathLike[str], max_to_keep: int | None = None) -> None:
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep} must be >= 1 (or None to keep all)")
        self.root = Path(root)
        self.max_to_keep = max_to_keep

    def step_dir(self, step: int) -> Path:
        """The directory of the checkpoint at ``step``."""
        return self.root / f"global_step_{step}"

    def save(
        self,
        step: int,
        trainer_state: Mapping[str, Any],
        workers: Mapping[str, Checkpointable] | None = None,
    ) -> Path:
        """Write workers' checkpoints and the trainer state for ``step``; return the directory.

        ``workers`` maps a role name (``actor``, ``critic``) to its group; each saves into
        ``<dir>/<role>``. The latest-step marker is updated last.
        """
        directory = self.step_dir(step)
        directory.mkdir(parents=True, exist_ok=True)
        for role, worker in (workers or {}).items():
            worker.save_checkpoint(str(directory / role))
        state = {"global_step": step, **trainer_state}
        torch.save(state, directory / STATE_FILE)
        summary = {k: v for k, v in state.items() if isinstance(v, int | float | str | bool)}
        (directory / "trainer_state.json").write_text(json.dumps(summary, indent=2))
        _write_atomic(self.root / LATEST_FILE, str(step))
        self._prune()
        return directory

    def latest(self) -> Path | None:
        """The newest complete checkpoint directory, or ``None`` when there is none."""
        marker = self.root / LATEST_FILE
        if not marker.is_file():
            return None
        directory = self.step_dir(int(marker.read_text().strip()))
        return directory if (directory / STATE_FILE).is_file() else None

    def load(
        self, directory: str | PathLike[str], workers: Mapping[str, Checkpointable] | None = None
    ) -> dict[str, Any]:
        """Load the workers' state from ``directory`` and return the trainer state."""
        path = Path(directory)
        state_file = path / STATE_FILE
        if not state_file.is_file():
            raise FileNotFoundError(
                f"{str(path)!r} is not a complete checkpoint (no {STATE_FILE}); pick a "
                f"global_step_<k> directory written by CheckpointManager.save"
            )
        for role, worker in (workers or {}).items():
            if not (path / role).exists():
                raise FileNotFoundError(
                    f"checkpoint {str(path)!r} has no {role!r} state; it was saved by a run "
                    f"without that role (present: {sorted(p.name for p in path.iterdir())})"
                )
            worker.load_checkpoint(str(path / role))
        state: dict[str, Any] = torch.load(state_file, weights_only=True)
        return state

    def checkpoints(self) -> list[Path]:
        """Complete checkpoint directories under ``root``, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for child in self.root.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and (child / STATE_FILE).is_file():
                found.append((int(match.group(1)), child))
        return [path for _, path in sorted(found)]

    def _prune(self) -> None:
        if self.max_to_keep is None:
            return
        for old in self.checkpoints()[: -self.max_to_keep]:
            shutil.rmtree(old, ignore_errors=True)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
