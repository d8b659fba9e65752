"""Trainer checkpoints: worker state (actor, critic) plus the driver's own state.

A checkpoint is a directory ``<root>/global_step_<k>/`` with one sub-directory per worker
role (written by the role's ``save_checkpoint``), ``trainer_state.pt`` (data-loader
position, RNG states, KL controller, anything else the trainer hands in; tensors and plain
data only) and a readable ``trainer_state.json`` summary.

Saving is atomic, so ``kill -9`` of the driver or a worker at any moment leaves the previous
checkpoint loadable:

1. everything (the workers' parts too) is written into ``<root>/.tmp-global_step_<k>-<id>/``;
2. its files are fsynced and the directory is renamed to ``global_step_<k>`` (one rename);
3. ``<root>/latest_checkpointed_iteration.txt`` is replaced last (temp file, fsync,
   ``os.replace``);
4. old checkpoints are pruned to ``max_checkpoints``, never the one ``latest`` names.

Before the fsync, ``manifest.json`` lists every file with its size and CRC-32
(:mod:`hf_algos.checkpoint_manifest`). Loading compares the files with it first: a file
missing, truncated or changed since the save raises :class:`DamagedCheckpointError` naming
the checkpoint, the file, and what was expected and found, before any state is loaded.
:meth:`CheckpointManager.resumable` then refuses, or takes the newest earlier good
checkpoint (``trainer.resume_fallback``); a damaged checkpoint is set aside as
``damaged-global_step_<k>``, never deleted. A checkpoint saved before manifests loads with
a one-line warning.

Temporary directories left by a killed save are removed by the next save (or resume).
Loading never unpickles code: every file is read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from hf_algos.checkpoint_manifest import MANIFEST_FILE, find_damage, has_manifest, write_manifest
from hf_controller import ConfigurationError
from hf_engines.checkpointing import load_state_file

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
"""Name of the file holding the step of the newest complete checkpoint."""
STATE_FILE = "trainer_state.pt"
"""The driver's state inside a checkpoint directory."""
TMP_PREFIX = ".tmp-"
"""Prefix of a checkpoint being written (and of one being replaced): never loaded."""
KILL_AT_ENV = "HF_CHECKPOINT_KILL_AT"
"""Fault-injection hook for tests: ``<point>@<step>`` SIGKILLs the driver at that point of
the save of ``step`` (points: :data:`KILL_POINTS`)."""
KILL_POINTS = ("start", "role:<name>", "state", "renamed", "latest")
"""Where :data:`KILL_AT_ENV` can kill a save: before anything, after a role's workers wrote
their part, after ``trainer_state.pt``, after the rename, after the ``latest`` pointer."""
TOKENIZER_DIR = "tokenizer"
"""The run's tokenizer inside a checkpoint directory (``save_pretrained``)."""
DAMAGED_PREFIX = "damaged-"
"""A damaged checkpoint set aside by a fallback: ``damaged-global_step_<k>``; kept, never
loaded, pruned or removed."""
FALLBACKS = ("refuse", "previous")
"""What a resume does when the checkpoint it would load is damaged
(``trainer.resume_fallback``)."""
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointError(ConfigurationError):
    """A checkpoint cannot be resumed from or exported: damaged, of another model, unreadable.

    A :class:`~hf_controller.ConfigurationError`, so the ``hybridflow`` command says it in
    one line with exit 2: the fix is another checkpoint (or a setting), not our code.
    """


class DamagedCheckpointError(CheckpointError):
    """A checkpoint's files differ from its manifest (a file missing, truncated, changed)."""


class SavesPretrained(Protocol):
    """A tokenizer (or anything) with transformers' ``save_pretrained(directory)``."""

    def save_pretrained(self, save_directory: str) -> Any:
        """Write the object's files into ``save_directory``."""
        ...


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
    """Saves and finds checkpoints under ``root``; keeps at most ``max_checkpoints`` of them."""

    def __init__(self, root: str | PathLike[str], max_checkpoints: int | None = None) -> None:
        if max_checkpoints is not None and max_checkpoints < 1:
            raise ValueError(
                f"max_checkpoints={max_checkpoints} must be >= 1 (or None to keep all)"
            )
        self.root = Path(root)
        self.max_checkpoints = max_checkpoints
        self._verified: set[Path] = set()  # checked against their manifest in this process

    def step_dir(self, step: int) -> Path:
        """The directory of the checkpoint at ``step``."""
        return self.root / f"global_step_{step}"

    def save(
        self,
        step: int,
        trainer_state: Mapping[str, Any],
        workers: Mapping[str, Checkpointable] | None = None,
        tokenizer: SavesPretrained | None = None,
        files: Mapping[str, str] | None = None,
    ) -> Path:
        """Write workers' checkpoints and the trainer state for ``step``; return the directory.

        ``workers`` maps a role name (``actor``, ``critic``) to its group; each saves into
        ``<tmp>/<role>`` of the temporary directory, which becomes ``global_step_<step>`` by
        one rename once complete. The ``latest`` pointer is replaced last. ``tokenizer`` is
        saved into :data:`TOKENIZER_DIR` (what an export writes next to the model).
        ``files`` are small text files written into the checkpoint by name (the run's
        identity record, :mod:`hf_algos.run_identity`).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        self.remove_stale()
        _kill_point("start", step)
        tmp = self.root / f"{TMP_PREFIX}global_step_{step}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        for role, worker in (workers or {}).items():
            worker.save_checkpoint(str(tmp / role))
            _kill_point(f"role:{role}", step)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp / TOKENIZER_DIR))
        state = {"global_step": step, **trainer_state}
        torch.save(state, tmp / STATE_FILE)
        summary = {k: v for k, v in state.items() if isinstance(v, int | float | str | bool)}
        (tmp / "trainer_state.json").write_text(json.dumps(summary, indent=2))
        for name, text in (files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        write_manifest(tmp)  # last: it lists every file above
        fsync_tree(tmp)
        _kill_point("state", step)
        directory = self.step_dir(step)
        if directory.exists():  # a save of this step that `latest` never named, or a re-run
            stale = self.root / f"{TMP_PREFIX}replaced-{directory.name}-{uuid.uuid4().hex[:8]}"
            os.replace(directory, stale)
        os.replace(tmp, directory)
        _fsync_dir(self.root)
        _kill_point("renamed", step)
        write_atomic(self.root / LATEST_FILE, str(step))
        _kill_point("latest", step)
        self.remove_stale()
        self._prune()
        return directory

    def remove_stale(self) -> list[Path]:
        """Delete the temporary directories of saves that never finished; return them."""
        if not self.root.is_dir():
            return []
        stale = [p for p in self.root.iterdir() if p.name.startswith(TMP_PREFIX) and p.is_dir()]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        if stale:
            logger.info(
                "removed %d unfinished checkpoint director(ies) under %s", len(stale), self.root
            )
        return stale

    def latest(self) -> Path | None:
        """The newest complete checkpoint directory, or ``None`` when there is none.

        The one the ``latest`` pointer names; when that is gone (deleted by hand, or a save
        of the same step was killed while replacing it), the newest complete one.
        """
        marker = self.root / LATEST_FILE
        if not marker.is_file():
            return None
        text = marker.read_text().strip()
        if text.isdigit():
            directory = self.step_dir(int(text))
            if (directory / STATE_FILE).is_file():
                return directory
        complete = self.checkpoints()
        if complete:
            logger.warning(
                "%s names %r, which is not a complete checkpoint; using %s",
                marker, text, complete[-1],
            )  # fmt: skip
        return complete[-1] if complete else None

    def load(
        self, directory: str | PathLike[str], workers: Mapping[str, Checkpointable] | None = None
    ) -> dict[str, Any]:
        """Load the workers' state from ``directory`` and return the trainer state.

        The files are first checked against the manifest (:meth:`verify`), so a damaged
        checkpoint raises :class:`DamagedCheckpointError` before any state changes. A file
        that cannot be read, or a worker's model of another shape, raises
        :class:`CheckpointError` (one line) instead of the worker's traceback. Nothing is
        unpickled beyond tensors and plain data: a ``trainer_state.pt`` holding code raises
        :class:`~hf_engines.checkpointing.UnsafeCheckpointError`.
        """
        path = Path(directory)
        state_file = path / STATE_FILE
        if not state_file.is_file() or path.name.startswith(TMP_PREFIX):
            raise FileNotFoundError(
                f"{str(path)!r} is not a complete checkpoint (no {STATE_FILE}, or an unfinished "
                f"save); pick a global_step_<k> directory written by CheckpointManager.save"
            )
        self.verify(path)
        # the driver's state first: a refused file stops before any worker state changes
        with _named_checkpoint_errors():
            state: dict[str, Any] = load_state_file(state_file)
        for role, worker in (workers or {}).items():
            if not (path / role).exists():
                raise FileNotFoundError(
                    f"checkpoint {str(path)!r} has no {role!r} state; it was saved by a run "
                    f"without that role (present: {sorted(p.name for p in path.iterdir())})"
                )
            with _named_checkpoint_errors():
                worker.load_checkpoint(str(path / role))
        return state

    def to_resume(self, resume_mode: str, resume_from: str | None) -> Path | None:
        """The checkpoint a resume in ``resume_mode`` loads (``trainer.resume_mode``):
        ``resume_from`` for ``path``, the :meth:`latest` under :attr:`root` for ``auto``
        (``None`` when there is none), ``None`` for ``disable``."""
        if resume_mode == "path":
            assert resume_from is not None  # checked by TrainerSection
            return Path(resume_from)
        return self.latest() if resume_mode == "auto" else None

    def verify(self, directory: str | PathLike[str]) -> None:
        """Compare the files of checkpoint ``directory`` with its manifest (once per process).

        Raises :class:`DamagedCheckpointError` naming the checkpoint, the first damaged file,
        and what the manifest expected against what was found. A checkpoint saved before
        manifests passes with a one-line warning.
        """
        damage = self.damage(directory)
        if damage is not None:
            raise DamagedCheckpointError(
                f"checkpoint {str(directory)!r} is damaged: {damage}; use an earlier checkpoint "
                "(a resume takes the newest good one with trainer.resume_fallback=previous)"
            )

    def damage(self, directory: str | PathLike[str]) -> str | None:
        """What is wrong with checkpoint ``directory``'s files against its manifest, or
        ``None`` (a checkpoint without a manifest: a warning, and ``None``)."""
        path = Path(directory)
        if path.resolve() in self._verified:
            return None
        if not has_manifest(path):
            logger.warning(
                "checkpoint %s has no %s (saved by an older version): its files are not "
                "verified", path, MANIFEST_FILE,
            )  # fmt: skip
            self._verified.add(path.resolve())  # warned once
            return None
        damage = find_damage(path)
        if damage is None:
            self._verified.add(path.resolve())
        return damage

    def resumable(self, directory: str | PathLike[str], fallback: str = "refuse") -> Path:
        """``directory`` when its files match its manifest; else, as ``fallback`` says.

        ``"refuse"`` raises :class:`DamagedCheckpointError` in one line naming the damaged
        checkpoint, the newest earlier good one and the key that takes it. ``"previous"``
        sets the damaged ones aside (renamed ``damaged-global_step_<k>``: nothing is
        deleted, and no later save or prune touches them), points ``latest`` at the newest
        earlier good checkpoint and returns it.
        """
        path = Path(directory)
        damage = self.damage(path)
        if damage is None:
            return path
        siblings = CheckpointManager(path.parent)
        siblings._verified = self._verified
        damaged, previous = siblings.last_good_before(path)
        if fallback == "previous" and previous is not None:
            kept = [siblings.set_aside(old) for old in damaged]
            write_atomic(siblings.root / LATEST_FILE, str(_step_of(previous)))
            logger.warning(
                "checkpoint %s is damaged (%s): kept as %s; resuming from %s "
                "(trainer.resume_fallback=previous)", path, damage,
                ", ".join(p.name for p in kept), previous,
            )  # fmt: skip
            return previous
        earlier = (
            f"the newest earlier good one is {str(previous)!r}: set "
            "trainer.resume_fallback=previous to resume from it (nothing is deleted)"
            if previous is not None
            else "there is no earlier good checkpoint: set trainer.resume_mode=disable to "
            "start fresh"
        )
        raise DamagedCheckpointError(f"checkpoint {str(path)!r} is damaged: {damage}; {earlier}")

    def last_good_before(self, directory: Path) -> tuple[list[Path], Path | None]:
        """The damaged checkpoint ``directory`` and the damaged ones just before it (newest
        first), and the newest complete checkpoint under :attr:`root` before it whose
        files match its manifest (or that has none; ``None`` when there is none)."""
        step = _step_of(directory)
        damaged = [directory]
        for candidate in reversed(self.checkpoints()):
            later = step is not None and (_step_of(candidate) or 0) >= step
            if later or candidate.resolve() == directory.resolve():
                continue
            if self.damage(candidate) is None:
                return damaged, candidate
            damaged.append(candidate)
        return damaged, None

    def set_aside(self, directory: Path) -> Path:
        """Rename damaged checkpoint ``directory`` ``damaged-<name>`` (kept for inspection;
        never loaded, pruned or removed) and return its new path."""
        aside = self.root / f"{DAMAGED_PREFIX}{directory.name}"
        if aside.exists():
            aside = aside.with_name(f"{aside.name}-{uuid.uuid4().hex[:8]}")
        os.replace(directory, aside)
        return aside

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
        """Keep the ``max_checkpoints`` newest complete checkpoints and the one ``latest`` names."""
        if self.max_checkpoints is None:
            return
        keep = self.latest()
        for old in self.checkpoints()[: -self.max_checkpoints]:
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)


def _step_of(directory: Path) -> int | None:
    """The ``k`` of a ``global_step_<k>`` directory, else ``None``."""
    match = _STEP_DIR.match(directory.name)
    return int(match.group(1)) if match else None


@contextmanager
def _named_checkpoint_errors() -> Iterator[None]:
    """Raise a :class:`CheckpointError` with the message of the user error (a damaged file,
    another model) that a load failed with, also when a worker group wrapped it."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as error:
        cause: BaseException | None = error
        while cause is not None and not isinstance(cause, ConfigurationError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise CheckpointError(str(cause)) from error


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text`` so a reader sees the old or the new, whole.

    Written to a temporary file beside it, fsynced, ``os.replace``d over it, and the
    directory fsynced so the rename survives a power loss too.
    """
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with tmp.open("w") as stream:
        stream.write(text)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (workers' parts included) before the
    rename publishes it: after a crash, a visible checkpoint is a complete one."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _kill_point(point: str, step: int) -> None:
    """The :data:`KILL_AT_ENV` test hook: SIGKILL this process at ``point`` of ``step``'s save."""
    wanted = os.environ.get(KILL_AT_ENV)
    if wanted and wanted == f"{point}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)
