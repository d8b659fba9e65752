"""Turn an engine checkpoint directory into a Hugging Face model directory, offline.

An engine's ``save_checkpoint`` writes, next to its sharded state, the
:class:`~hf_engines.config.EngineConfig` it ran with and the model's ``config.json``
(:func:`hf_engines.checkpointing.save_model_metadata`). :func:`export_engine_checkpoint`
rebuilds the engine from those files alone (no run config, no original model directory, no
Ray), loads the checkpoint and writes it with ``save_pretrained``. It runs in fresh
processes on the CPU with gloo: one for an FSDP checkpoint (DCP reshards to any world
size), and as many as the run had for a Megatron checkpoint (its per-rank files load on the
same layout only). A LoRA checkpoint (adapters only) is merged into its base model in this
process instead.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from hf_engines.checkpointing import (
    DEFAULT_MAX_SHARD_SIZE,
    HF_CONFIG_DIR,
    hf_export,
    load_engine_config,
    write_hf_directory,
)
from hf_engines.config import EngineConfig, FSDPConfig, ModelConfig


def export_config(directory: Path) -> EngineConfig:
    """The engine config that rebuilds the checkpoint in ``directory`` on the CPU.

    The model comes from the checkpoint's own ``config.json`` (random weights, overwritten
    by the checkpoint), so the original model directory is not needed; a model with its own
    code (``auto_map``) is the exception and is built from its original directory.
    """
    config = load_engine_config(directory)
    hf_config = json.loads((directory / HF_CONFIG_DIR / "config.json").read_text())
    model = config.model
    if "auto_map" not in hf_config:
        model = ModelConfig(
            hf_config=hf_config,
            dtype=model.dtype,
            seed=model.seed,
            head=model.head,
            attn_implementation=model.attn_implementation,
            remove_padding=model.remove_padding,
        )
    if config.backend == "fsdp":
        # one process holds the whole model: no replicas, no offload, CPU
        return dataclasses.replace(
            config, model=model, fsdp=FSDPConfig(device="cpu"), offload=False
        )
    megatron = dataclasses.replace(config.megatron, device="cpu")
    return dataclasses.replace(config, model=model, megatron=megatron, offload=False)


def checkpoint_world_size(directory: Path, config: EngineConfig) -> int:
    """Processes that load the checkpoint: 1 for FSDP, the saved world size for Megatron."""
    if config.backend == "fsdp":
        return 1
    meta = json.loads((directory / "meta.json").read_text())
    return int(meta["world_size"])


ADAPTER_DIR = "adapter"
"""The sub-directory where a LoRA engine saves its adapter in peft's layout."""


def export_lora_checkpoint(
    directory: Path, out_dir: Path, dtype: str | None, max_shard_size: str | int
) -> Path:
    """Export a LoRA checkpoint: its base model (``model.path`` of the saved engine config)
    with the adapter of ``directory/adapter`` merged in, written like :meth:`export_hf`.

    A LoRA checkpoint's sharded state holds the adapters only, so the base model's own
    directory (or cached model id) must still be there.
    """
    from hf_engines.lora import load_merged_model

    model = load_engine_config(directory).model
    merged = load_merged_model(directory / ADAPTER_DIR, model.local_path())
    export = hf_export(model, type(merged), dtype, max_shard_size)
    weights = {name: t.detach().contiguous() for name, t in merged.state_dict().items()}
    write_hf_directory(out_dir, weights, merged.config, export, merged.generation_config)
    return out_dir


EXPORT_TIMEOUT_S = 3600.0
"""How long the export processes may run before they are killed (a large model on CPU)."""


def _export_rank(directory: str, out_dir: str, dtype: str | None, max_shard_size: str) -> None:
    """One process of the export: join the gloo group, load, export (collective)."""
    import torch.distributed as dist

    from hf_engines.workers.base import build_engine

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_* set by launch_ranks
    try:
        engine = build_engine(export_config(Path(directory)))
        engine.load_checkpoint(directory)
        shard: str | int = int(max_shard_size) if max_shard_size.isdigit() else max_shard_size
        engine.export_hf(out_dir, dtype, shard)
    finally:
        dist.destroy_process_group()


def export_engine_checkpoint(
    directory: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    dtype: str | None = None,
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write the model of engine checkpoint ``directory`` as a Hugging Face directory.

    ``dtype`` is the dtype of the written weights (default: the dtype trained in,
    ``model.dtype`` of the saved engine config); ``max_shard_size`` bounds each safetensors
    file. Runs in fresh CPU processes (see the module docstring) and returns ``out_dir``.
    The source tokenizer is not written here (an engine checkpoint holds none). A truncated
    or damaged FSDP checkpoint raises :class:`~hf_engines.checkpointing.CorruptCheckpointError`
    before any process starts.
    """
    from hf_engines.testing import launch_ranks

    source = Path(directory).resolve()
    if (source / ADAPTER_DIR / "adapter_config.json").is_file():
        return export_lora_checkpoint(source, Path(out_dir).resolve(), dtype, max_shard_size)
    config = export_config(source)
    if config.backend == "fsdp":  # a damaged file: one named error here, not a rank's traceback
        from hf_engines.fsdp.safe_dcp import check_metadata, check_storage_sizes

        check_storage_sizes(source / "dcp", check_metadata(source / "dcp" / ".metadata"))
    world_size = checkpoint_world_size(source, config)
    out = Path(out_dir).resolve()
    # ``-m`` as the "script": run as a module, so this package's directory is not put first
    # on sys.path (its ``megatron`` sub-package would shadow megatron-core).
    args = ["hf_engines.export", str(source), str(out), dtype or "", str(max_shard_size)]
    launch_ranks("-m", world_size, args, EXPORT_TIMEOUT_S)
    return out


def main() -> None:
    """``python -m hf_engines.export CHECKPOINT OUT DTYPE MAX_SHARD_SIZE`` on one rank."""
    directory, out_dir, dtype, max_shard_size = sys.argv[1:5]
    _export_rank(directory, out_dir, dtype or None, max_shard_size)


if __name__ == "__main__":
    main()
