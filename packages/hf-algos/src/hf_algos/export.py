"""Training checkpoint -> Hugging Face model directory (what ``hybridflow export`` runs).

A trainer checkpoint (``<root>/global_step_<k>/``, see :mod:`hf_algos.checkpoint`) holds one
engine checkpoint per trained role (``actor/``, ``critic/``), each with the engine config
and model ``config.json`` it was written with, and the run's tokenizer (``tokenizer/``).
That is all :func:`export_checkpoint` reads: no run config file, no original model
directory, no Ray cluster. FSDP (DCP) and Megatron checkpoints both work.

Exports are atomic (:func:`atomic_directory`): written into a temporary sibling of the
target (``.tmp-<name>-<id>``), fsynced, and renamed into place, so the target is the old
directory or the whole new one, never a mix (a killed export leaves only the temporary
sibling). An existing non-empty target is refused unless ``overwrite``, which replaces it
whole: no file of the old directory (a ``chat_template.jinja`` of another model) survives.
Every file follows the umask (``model.safetensors`` as the rest).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hf_algos.checkpoint import (
    STATE_FILE,
    TMP_PREFIX,
    TOKENIZER_DIR,
    CheckpointManager,
    fsync_tree,
)
from hf_controller import ConfigurationError
from hf_engines.checkpointing import (
    DEFAULT_MAX_SHARD_SIZE,
    ENGINE_CONFIG_FILE,
    follow_umask,
    load_engine_config,
    save_tokenizer,
)
from hf_engines.export import export_engine_checkpoint

__all__ = ["atomic_directory", "checkpoint_step", "export_checkpoint", "find_engine_checkpoint"]


def find_engine_checkpoint(checkpoint_dir: str | os.PathLike[str], role: str = "actor") -> Path:
    """The engine checkpoint of ``role`` under ``checkpoint_dir``.

    ``checkpoint_dir`` may be a checkpoint root (the newest complete checkpoint, as named by
    ``latest_checkpointed_iteration.txt``, is used), one ``global_step_<k>`` directory, or a
    role directory itself. Raises ``FileNotFoundError`` naming what was found and the fix.
    """
    path = Path(checkpoint_dir)
    if not path.is_dir():
        raise FileNotFoundError(
            f"checkpoint_dir={str(path)!r} is not a directory; pass trainer.checkpoint_dir of a "
            "run, or one of its global_step_<k> directories"
        )
    if (path / ENGINE_CONFIG_FILE).is_file():
        return path
    if not (path / STATE_FILE).is_file():
        latest = CheckpointManager(path).latest()
        if latest is None:
            raise FileNotFoundError(
                f"{str(path)!r} holds no complete checkpoint (no global_step_<k> with "
                f"{STATE_FILE}, no latest_checkpointed_iteration.txt); pass trainer."
                "checkpoint_dir of a run that saved one, or a global_step_<k> directory"
            )
        path = latest
    role_dir = path / role
    if not (role_dir / ENGINE_CONFIG_FILE).is_file():
        roles = sorted(p.name for p in path.iterdir() if (p / ENGINE_CONFIG_FILE).is_file())
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} has no exportable {role!r} model (roles with a model: "
            f"{roles}); pick one of those as role, or a checkpoint written by this version "
            f"(older ones lack {role}/{ENGINE_CONFIG_FILE})"
        )
    return role_dir


def checkpoint_step(role_dir: str | os.PathLike[str]) -> int | None:
    """The ``global_step`` an engine checkpoint (a role directory) was saved at, or ``None``
    when its ``meta.json`` does not say."""
    try:
        return int(json.loads((Path(role_dir) / "meta.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _check_target(target: Path, overwrite: bool) -> None:
    """Refuse a target that is a file, or a non-empty directory unless ``overwrite``."""
    if target.exists() and not target.is_dir():
        raise ConfigurationError(
            f"the export target {str(target)!r} is a file, not a directory; pass a directory"
        )
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        present = sorted(p.name for p in target.iterdir())
        shown = ", ".join(present[:4]) + (", ..." if len(present) > 4 else "")
        raise ConfigurationError(
            f"the export target {str(target)!r} exists and is not empty ({shown}); pass "
            "--overwrite (overwrite=True) to replace it whole, or choose a new directory"
        )


@contextmanager
def atomic_directory(out_dir: str | os.PathLike[str], overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``out_dir`` to write into; on success it becomes
    ``out_dir`` by a rename (after an fsync, every file following the umask).

    An existing non-empty ``out_dir`` raises :class:`~hf_controller.ConfigurationError`
    unless ``overwrite``; then the old directory is renamed aside and deleted only once the
    new one is in place. A parent that cannot be written raises a one-line
    ``ConfigurationError`` before anything is exported. On an error the temporary directory
    is removed and ``out_dir`` is untouched.
    """
    target = Path(out_dir).absolute()
    _check_target(target, overwrite)
    tmp = target.with_name(f"{TMP_PREFIX}{target.name}-{uuid.uuid4().hex[:8]}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as error:
        raise ConfigurationError(
            f"cannot write the export to {str(target)!r}: {error.strerror or error} at "
            f"{error.filename or target.parent!r}; choose a directory you can write to"
        ) from error
    try:
        yield tmp
        follow_umask(tmp)
        fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = target.with_name(f"{TMP_PREFIX}replaced-{target.name}-{uuid.uuid4().hex[:8]}")
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def export_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    dtype: str | None = None,
    *,
    role: str = "actor",
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
    overwrite: bool = False,
) -> Path:
    """Write the ``role`` model of a training checkpoint as a Hugging Face directory.

    ``out_dir`` gets what ``save_pretrained`` writes: ``config.json``, sharded safetensors
    (at most ``max_shard_size`` each), ``generation_config.json`` and the run's tokenizer,
    so ``AutoModelForCausalLM.from_pretrained(out_dir)`` (a critic:
    ``AutoModelForTokenClassification``) and ``AutoTokenizer.from_pretrained(out_dir)`` load
    it. ``dtype`` (``float32`` / ``bfloat16`` / ``float16``) defaults to the dtype the model
    was trained in (``model.dtype`` of the run). Runs in local CPU processes (one for FSDP,
    the run's world size for Megatron); returns ``out_dir``.

    Atomic (:func:`atomic_directory`): an existing non-empty ``out_dir`` is refused unless
    ``overwrite``, which replaces it whole. The checkpoint's files are first checked against
    its manifest: a damaged checkpoint raises
    :class:`~hf_algos.checkpoint.DamagedCheckpointError` (one line) and writes nothing.
    """
    role_dir = find_engine_checkpoint(checkpoint_dir, role)
    step_dir = role_dir.parent
    if (step_dir / STATE_FILE).is_file():
        CheckpointManager(step_dir.parent).verify(step_dir)
    with atomic_directory(out_dir, overwrite) as tmp:
        export_engine_checkpoint(role_dir, tmp, dtype, max_shard_size)
        tokenizer_dir = role_dir.parent / TOKENIZER_DIR
        if tokenizer_dir.is_dir():
            trust = load_engine_config(role_dir).model.trust_remote_code
            save_tokenizer(tokenizer_dir, tmp, trust_remote_code=trust)
    return Path(out_dir).absolute()
