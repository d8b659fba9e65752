"""A run's output directories, checked before anything trains.

Before Ray starts, the ``hybridflow`` command checks that every directory the run will
write is writable (``trainer.checkpoint_dir``, ``trainer.log_dir``, ``trainer.export_dir``
and, for a ``.gguf`` model, the import cache): :func:`check_writable` creates and removes a
probe file in it (or in its nearest existing parent, leaving nothing behind), so an
unwritable one is refused in one line naming the key, the path and the fix, instead of a
``PermissionError`` traceback after the steps. It then locks the checkpoint directory
(:mod:`hf_algos.run_lock`) and says in one line when nothing of the run will be saved.
"""

from __future__ import annotations

import os
from os import PathLike
from pathlib import Path
from typing import Any

from hf_controller import ConfigurationError

CHECKPOINT_KEY = "trainer.checkpoint_dir"
"""The setting of the checkpoint directory (locked while a run writes it)."""


def check_writable(key: str, directory: str | PathLike[str]) -> None:
    """Refuse ``directory`` (the value of ``key``) unless this process can write in it.

    A missing directory is checked at its nearest existing parent (where it would be
    created); nothing is left behind. Raises :class:`~hf_controller.ConfigurationError`.
    """
    path = Path(directory).expanduser()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    probe = existing / f".hybridflow-probe-{os.getpid()}"
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{str(existing)!r} is a file, not a directory")
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        probe.unlink()
    except OSError as error:
        raise ConfigurationError(
            f"{key}={str(directory)!r} is not writable ({type(error).__name__}: "
            f"{error.strerror or error}); point {key} at a directory this user can write, "
            f"or fix its permissions"
        ) from None


def output_directories(trainer: Any, model_path: str | None = None) -> dict[str, str]:
    """The directories a run writes, by key: checkpoints, logs, the export (when set) and
    the GGUF import cache (when ``model_path`` is a ``.gguf`` file). ``trainer`` is the
    ``trainer`` section (a :class:`~hf_algos.config.trainer.TrainerSection` or its tree)."""
    from hf_algos.config.trainer import checkpoint_dir_of

    checkpoint_dir = checkpoint_dir_of(
        trainer.checkpoint_dir, trainer.project_name, trainer.experiment_name
    )
    found = {CHECKPOINT_KEY: str(checkpoint_dir), "trainer.log_dir": str(trainer.log_dir)}
    if trainer.export_dir is not None:
        found["trainer.export_dir"] = str(trainer.export_dir)
    if model_path is not None and str(model_path).endswith(".gguf"):
        from hf_engines.gguf import gguf_cache_dir

        found["the GGUF import cache ($HYBRIDFLOW_CACHE)"] = str(gguf_cache_dir())
    return found


def saves_nothing(trainer: Any) -> bool:
    """Whether a run with this ``trainer`` section keeps nothing: no periodic or final
    checkpoint and no export."""
    return not (trainer.save_freq or trainer.save_final or trainer.export_dir is not None)


NOTHING_SAVED = (
    "hybridflow: nothing of this run will be saved (trainer.save_freq=0, "
    "trainer.save_final=false, no trainer.export_dir); set trainer.save_final=true or "
    "trainer.export_dir=DIR to keep the trained model"
)
"""The line the ``hybridflow`` command prints at the start of a run that saves nothing."""
