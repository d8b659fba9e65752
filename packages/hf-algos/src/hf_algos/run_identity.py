"""What a checkpoint belongs to, and the check that a resume continues the same job.

Every checkpoint carries ``run_identity.json`` (:data:`IDENTITY_FILE`): the project and
experiment, the model (its path and a hash of its ``config.json``, the architecture) and a
hash of the settings a checkpoint's shards depend on (engine backend and parallel layout,
LoRA, model head, the critic). :func:`check_resume_identity` compares a checkpoint's record
with the run about to resume from it and refuses a mismatch in one line naming both values
and ``trainer.resume_force``, instead of resuming another experiment's run (and training
nothing) or dying in a size-mismatch traceback. A checkpoint written before these records
resumes with a one-line warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hf_controller import ConfigurationError

logger = logging.getLogger(__name__)

IDENTITY_FILE = "run_identity.json"
"""Name of the identity record inside a checkpoint directory."""
FORCE_KEY = "trainer.resume_force"
"""The setting that resumes a checkpoint whatever its record says."""
_LAYOUT_KEYS = (
    ("actor", "engine", "backend"),
    ("actor", "engine", "megatron"),
    ("actor", "engine", "model", "head"),
    ("actor", "lora", "rank"),
    ("actor", "lora", "target_modules"),
    ("critic", "engine", "backend"),
    ("critic", "engine", "model", "head"),
    ("critic", "lora", "rank"),
)
"""The settings a checkpoint's shards are laid out by (hashed into ``layout``)."""


@dataclass(frozen=True)
class RunIdentity:
    """What a checkpoint belongs to; compared field by field on resume."""

    experiment: str
    """``<project_name>/<experiment_name>``."""
    architecture: str
    """Hash of the actor model's architecture (its ``config.json``, else ``hf_config``)."""
    model: str
    """The actor model's path (named in messages, not compared: a model may move)."""
    layout: str
    """Hash of the engine backend and parallel layout, LoRA, model head and critic."""


def _get(config: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """``config[k0][k1]...``, ``None`` where a level is missing."""
    value: Any = config
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _digest(data: Any) -> str:
    """12 hex characters of the sha256 of ``data`` as canonical JSON."""
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def architecture_hash(model: Mapping[str, Any] | None) -> str:
    """A hash of a model section's architecture: its local ``config.json``, else its
    inline ``hf_config``, and its revision."""
    model = model or {}
    path = model.get("path")
    config_file = Path(str(path)) / "config.json" if path else None
    if config_file is not None and config_file.is_file():
        try:
            architecture: Any = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            architecture = config_file.read_bytes().hex()
    else:
        architecture = model.get("hf_config")
    return _digest([architecture, model.get("revision")])


def run_identity(config: Mapping[str, Any]) -> RunIdentity:
    """The identity of the run whose resolved config (as plain data) is ``config``."""
    trainer = config.get("trainer") or {}
    model = _get(config, ("actor", "engine", "model"))
    return RunIdentity(
        experiment=f"{trainer.get('project_name')}/{trainer.get('experiment_name')}",
        architecture=architecture_hash(model),
        model=str(_get(config, ("actor", "engine", "model", "path"))),
        layout=_digest({".".join(keys): _get(config, keys) for keys in _LAYOUT_KEYS}),
    )


def identity_text(identity: RunIdentity) -> str:
    """The record written into each checkpoint (:data:`IDENTITY_FILE`)."""
    return json.dumps(asdict(identity), indent=2)


def check_resume_identity(
    checkpoint: Path, identity: RunIdentity, force: bool, same_experiment: bool = True
) -> None:
    """Refuse to resume ``checkpoint`` when its record differs from ``identity``
    (the experiment too when ``same_experiment``: evaluation may load another's).

    Raises :class:`~hf_controller.ConfigurationError` naming the first differing field,
    both values and the fix; ``force`` (``trainer.resume_force``) logs the mismatch and goes
    on. A checkpoint without a record (written before them) resumes with a warning.
    """
    record_file = checkpoint / IDENTITY_FILE
    if not record_file.is_file():
        logger.warning(
            "checkpoint %s has no %s (saved by an older version): resuming it without "
            "checking that it belongs to this experiment and model",
            checkpoint, IDENTITY_FILE,
        )  # fmt: skip
        return
    try:
        record = json.loads(record_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigurationError(
            f"checkpoint {str(checkpoint)!r}: its {IDENTITY_FILE} cannot be read ({error}); "
            f"set {FORCE_KEY}=true to resume it anyway"
        ) from error
    record = record if isinstance(record, dict) else {}
    names = ("experiment", "architecture", "layout")
    for name in names if same_experiment else names[1:]:
        ours, theirs = getattr(identity, name), record.get(name)
        if theirs == ours:
            continue
        what = {"layout": "engine layout/LoRA/critic (hash)"}.get(name, name)
        if name == "architecture":
            what = "model (config.json hash)"
            theirs = f"{record.get('model')} ({theirs})"
            ours = f"{identity.model} ({ours})"
        message = (
            f"checkpoint {str(checkpoint)!r} belongs to another job: its {what} is "
            f"{theirs!r}, this run's is {ours!r}"
        )
        if force:
            logger.warning("%s; resuming it anyway (%s=true)", message, FORCE_KEY)
            return
        raise ConfigurationError(
            f"{message}; set {FORCE_KEY}=true to resume it anyway, or start fresh with "
            f"trainer.resume_mode=disable or another trainer.checkpoint_dir"
        )
