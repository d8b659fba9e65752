"""Training checkpoint -> Hugging Face model directory (what ``hybridflow export`` runs).

A trainer checkpoint (``<root>/global_step_<k>/``, see :mod:`hf_algos.checkpoint`) holds one
engine checkpoint per trained role (``actor/``, ``critic/``), each with the engine config
and model ``config.json`` it was written with, and the run's tokenizer (``tokenizer/``).
That is all :func:`export_checkpoint` reads: no run config file, no original model
directory, no Ray cluster. FSDP (DCP) and Megatron checkpoints both work.
"""

from __future__ import annotations

import os
from pathlib import Path

from hf_algos.checkpoint import STATE_FILE, TOKENIZER_DIR, CheckpointManager
from hf_engines.checkpointing import (
    DEFAULT_MAX_SHARD_SIZE,
    ENGINE_CONFIG_FILE,
    load_engine_config,
    save_tokenizer,
)
from hf_engines.export import export_engine_checkpoint

__all__ = ["export_checkpoint", "find_engine_checkpoint"]


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


def export_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    dtype: str | None = None,
    *,
    role: str = "actor",
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write the ``role`` model of a training checkpoint as a Hugging Face directory.

    ``out_dir`` gets what ``save_pretrained`` writes: ``config.json``, sharded safetensors
    (at most ``max_shard_size`` each), ``generation_config.json`` and the run's tokenizer,
    so ``AutoModelForCausalLM.from_pretrained(out_dir)`` (a critic:
    ``AutoModelForTokenClassification``) and ``AutoTokenizer.from_pretrained(out_dir)`` load
    it. ``dtype`` (``float32`` / ``bfloat16`` / ``float16``) defaults to the dtype the model
    was trained in (``model.dtype`` of the run). Runs in local CPU processes (one for FSDP,
    the run's world size for Megatron); returns ``out_dir``.
    """
    role_dir = find_engine_checkpoint(checkpoint_dir, role)
    out = export_engine_checkpoint(role_dir, out_dir, dtype, max_shard_size)
    tokenizer_dir = role_dir.parent / TOKENIZER_DIR
    if tokenizer_dir.is_dir():
        trust = load_engine_config(role_dir).model.trust_remote_code
        save_tokenizer(tokenizer_dir, out, trust_remote_code=trust)
    return out
