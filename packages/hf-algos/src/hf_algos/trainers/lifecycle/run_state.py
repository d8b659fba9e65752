"""A run's state, composed: its step, the parts of the driver's state, the worker groups
that save their own shards, and the point a restart goes back to.

A trainer hands its :class:`RunState` what it keeps, anything with ``state_dict`` /
``load_state_dict`` (:meth:`RunState.keep`): the base trainer the loader's position and the
driver's RNG, PPO its KL controller and, in an async mode, the generations in flight. Its
worker groups (:attr:`RunState.groups`) say which of them save with a checkpoint and what
follows a load (the rollout getting the restored weights).
Saving, resuming and a restart's going back all read that one registry, as torchtitan's
``CheckpointManager`` reads its ``states``; no trainer overrides a hook for them.

A checkpoint's driver file keeps its layout: ``{"global_step", "loader", "rng", "extra":
{<a trainer's own parts>}, "run_id"}`` (:mod:`hf_algos.checkpoint` writes it atomically).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from hf_algos.checkpoint import (
    Checkpointable,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
)
from hf_algos.run_identity import IDENTITY_FILE


class Stateful(Protocol):
    """A part of the run's state: plain data and tensors out, the same back in."""

    def state_dict(self) -> Any:
        """The part's state (tensors and plain data: checkpoints load ``weights_only``)."""
        ...

    def load_state_dict(self, state: Any) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...


class RNGState:
    """The driver's random generators (Python, NumPy, torch) as a part of the run's state."""

    def state_dict(self) -> dict[str, Any]:
        """The generators' states (:func:`~hf_algos.checkpoint.capture_rng_state`)."""
        return capture_rng_state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put the generators back where :meth:`state_dict` found them."""
        restore_rng_state(state)


class WorkerGroups(Protocol):
    """The run's worker groups as the run state sees them (a trainer's
    :class:`~hf_algos.trainers.roles.groups.RoleGroups`)."""

    def checkpointed(self) -> Mapping[str, Checkpointable]:
        """The groups that save their shards with a checkpoint, by name."""
        ...

    def restored(self, step: int) -> None:
        """Called after a checkpoint of ``step`` was loaded into them (e.g. the rollout gets
        the restored weights)."""
        ...


class RunState:
    """The step, the driver's parts and the worker groups of a run, saved and loaded together.

    ``checkpoints`` writes and finds the checkpoint directories. After a restart,
    :meth:`go_back` loads the last checkpoint this run saved or resumed from
    (:attr:`resume_point`), or, when there is none, the state :meth:`mark_start` recorded.
    """

    def __init__(self, checkpoints: CheckpointManager) -> None:
        self.checkpoints = checkpoints
        self.step = 0
        """The last step taken (0 before the first)."""
        self.run_id: str | None = None
        """The run's id (its log directory's name), saved with every checkpoint."""
        self.core: dict[str, Stateful] = {}
        self.extra: dict[str, Stateful] = {}
        self.groups: WorkerGroups | None = None
        """The run's worker groups (their shards are saved and loaded with the driver's
        state); ``None`` before the trainer starts them."""
        self.tokenizer: Any = None
        """Saved with every checkpoint, so an export writes it next to the model."""
        self.identity_record: str | None = None
        """What the checkpoints belong to, written into each (:mod:`hf_algos.run_identity`)."""
        self.resume_point: Path | None = None
        """The checkpoint a restart goes back to: the last saved or loaded."""
        self._start: dict[str, Any] | None = None

    def keep(self, name: str, part: Stateful, *, core: bool = False) -> None:
        """Save ``part`` with every checkpoint under ``name``: at the top of the driver's
        file when ``core`` (the base trainer's ``loader`` and ``rng``), else under
        ``extra`` (a trainer's own parts). A name is kept once."""
        if name in self.core or name in self.extra:
            raise ValueError(f"the run state already keeps a part named {name!r}")
        (self.core if core else self.extra)[name] = part

    def driver_state(self) -> dict[str, Any]:
        """The driver's file of a checkpoint, the step aside."""
        state: dict[str, Any] = {name: part.state_dict() for name, part in self.core.items()}
        state["extra"] = {name: part.state_dict() for name, part in self.extra.items()}
        state["run_id"] = self.run_id
        return state

    def load_driver_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`driver_state`. A part the checkpoint lacks under ``extra`` (saved by
        a run without it) keeps its state; a checkpoint without a run id keeps the current."""
        for name, part in self.core.items():
            part.load_state_dict(state[name])
        extra = state.get("extra", {})
        for name, part in self.extra.items():
            if name in extra:
                part.load_state_dict(extra[name])
        self.run_id = state.get("run_id") or self.run_id

    def mark_start(self) -> None:
        """Record the state a restart goes back to while no checkpoint exists."""
        self._start = copy.deepcopy(self.driver_state())

    def save(self) -> Path:
        """Save the workers' shards and the driver's state at :attr:`step`; a restart goes
        back here."""
        files = {IDENTITY_FILE: self.identity_record} if self.identity_record else None
        directory = self.checkpoints.save(
            self.step, self.driver_state(), self._checkpointed(), self.tokenizer, files
        )
        self.resume_point = directory
        return directory

    def load(self, directory: Path) -> None:
        """Load the checkpoint in ``directory`` (step, workers, driver), then tell the
        groups (:meth:`WorkerGroups.restored`); a restart goes back here."""
        state = self.checkpoints.load(directory, self._checkpointed())
        self.step = int(state["global_step"])
        self.load_driver_state(state)
        if self.groups is not None:
            self.groups.restored(self.step)
        self.resume_point = directory

    def _checkpointed(self) -> Mapping[str, Checkpointable]:
        return self.groups.checkpointed() if self.groups is not None else {}

    def go_back(self) -> None:
        """After a restart (new worker groups): load :attr:`resume_point`, else the start
        :meth:`mark_start` recorded (step 0; the new groups start from the initial model)."""
        if self.resume_point is not None:
            self.load(self.resume_point)
            return
        assert self._start is not None, "mark_start() was not called"
        self.step = 0
        self.load_driver_state(copy.deepcopy(self._start))
