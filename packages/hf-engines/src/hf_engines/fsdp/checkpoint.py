"""Checkpoints, Hugging Face export and full-parameter iteration for the FSDP engine.

Checkpoints are sharded with ``torch.distributed.checkpoint`` (DCP) and resume on another
number of ranks; the Megatron engine's counterpart is :mod:`hf_engines.megatron.checkpoint`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LRScheduler
from transformers import PreTrainedModel

from hf_engines.checkpointing import (
    ENGINE_CONFIG_FILE,
    HF_CONFIG_DIR,
    CheckpointMismatchError,
    HFExport,
    load_state_file,
    rng_state,
    set_rng_state,
    write_hf_directory,
)
from hf_engines.fsdp.safe_dcp import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    check_metadata,
    check_storage_sizes,
)

_DCP_DIR = "dcp"


def _extra_state_file(directory: Path, rank: int) -> Path:
    return directory / f"extra_state_rank{rank}.pt"


def save_checkpoint(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    global_step: int,
    frozen: bool = True,
) -> None:
    """Write a sharded checkpoint (collective): DCP for model + optimizer, a file per rank.

    The DCP part can be loaded on a different number of ranks; the per-rank file holds the
    scheduler, step and that rank's RNG state. ``frozen=False`` leaves out the parameters
    that do not train (a LoRA run's base model, reloaded from its own files).
    """
    model_state, optim_state = get_state_dict(model, optimizer, options=_options(frozen))
    model_state = _without_frozen(model, model_state, frozen)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory / _DCP_DIR)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    extra = {"scheduler": scheduler.state_dict(), "global_step": global_step, "rng": rng_state()}
    torch.save(extra, _extra_state_file(directory, rank))
    if rank == 0:
        meta = {"global_step": global_step, "world_size": world_size, "format": "hf-engines/fsdp2"}
        (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    dist.barrier()


def load_checkpoint(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    frozen: bool = True,
) -> int:
    """Restore a checkpoint written by :func:`save_checkpoint` (collective); return the step.

    On a different number of ranks than at save time, ranks without their own RNG file take
    rank 0's. ``frozen`` must be what the checkpoint was saved with.
    """
    if not (directory / _DCP_DIR).is_dir():
        raise FileNotFoundError(
            f"{directory} holds no hf-engines checkpoint (no {_DCP_DIR}/ inside); pass the "
            "directory given to save_checkpoint"
        )
    options = _options(frozen)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    model_state = _without_frozen(model, model_state, frozen)
    # DCP loads into these dicts in place, resharding to this run's layout.
    # The safe reader and planner never unpickle code (see hf_engines.fsdp.safe_dcp); the
    # checks up front raise the named error themselves instead of DCP's per-rank wrapper of
    # it: refused code, a damaged or truncated file, another model's shapes.
    metadata = check_metadata(directory / _DCP_DIR / ".metadata")
    check_storage_sizes(directory / _DCP_DIR, metadata)
    check_same_model(directory, metadata, model_state, model)
    dcp.load(
        {"model": model_state, "optim": optim_state},
        storage_reader=SafeFileSystemReader(directory / _DCP_DIR),
        planner=SafeLoadPlanner(),
    )
    set_state_dict(
        model,
        optimizer,
        model_state_dict=model_state,
        optim_state_dict=optim_state,
        options=options,
    )
    own = _extra_state_file(directory, dist.get_rank())
    extra = load_state_file(own if own.is_file() else _extra_state_file(directory, 0))
    scheduler.load_state_dict(extra["scheduler"])
    set_rng_state(extra["rng"])
    return int(extra["global_step"])


def check_same_model(
    directory: Path, metadata: Metadata, model_state: dict[str, Any], model: torch.nn.Module
) -> None:
    """Raise :class:`CheckpointMismatchError` when the checkpoint in ``directory`` lacks a
    tensor of ``model_state`` or holds it with another shape: a checkpoint of another model,
    named with both models, instead of DCP's size-mismatch traceback."""
    saved = metadata.state_dict_metadata
    for name, value in model_state.items():
        if not isinstance(value, torch.Tensor):
            continue
        entry = saved.get(f"model.{name}")
        found = list(entry.size) if isinstance(entry, TensorStorageMetadata) else None
        if found == list(value.shape):
            continue
        what = f"shape {found}" if found is not None else "no such tensor"
        raise CheckpointMismatchError(
            f"checkpoint {str(directory)!r} holds another model ({_saved_model(directory)}) "
            f"than this run's ({getattr(model.config, 'name_or_path', '') or 'unnamed'!r}, "
            f"model type {getattr(model.config, 'model_type', '?')!r}): {name} is "
            f"{list(value.shape)} here, {what} in the checkpoint; resume from a checkpoint "
            "of this model, or set trainer.resume_mode=disable (or another checkpoint_dir)"
        )


def _saved_model(directory: Path) -> str:
    """How the checkpoint names its model: the saved engine config's path and model type."""
    names = []
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        names.append(
            repr(json.loads((directory / ENGINE_CONFIG_FILE).read_text())["model"]["path"])
        )
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        hf_config = json.loads((directory / HF_CONFIG_DIR / "config.json").read_text())
        names.append(f"model type {hf_config['model_type']!r}")
    return ", ".join(names) or "unnamed"


def _options(frozen: bool) -> StateDictOptions:
    """State-dict options: with ``frozen=False`` only the parameters that train."""
    # strict=False: the frozen parameters are absent on purpose (they keep their weights).
    return StateDictOptions(ignore_frozen_params=not frozen, strict=frozen)


def _without_frozen(
    model: torch.nn.Module, model_state: dict[str, Any], frozen: bool
) -> dict[str, Any]:
    """``model_state`` as is, or with ``frozen=False`` only the entries of trainable
    parameters: ``ignore_frozen_params`` still keeps a tied output head (a second name of
    the frozen embedding, vocab x hidden)."""
    if frozen:
        return model_state
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    return {name: value for name, value in model_state.items() if name in trainable}


def iter_full_params(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` for each ``state_dict()`` entry, gathering one at a time.

    Collective: every rank must consume the whole iterator. Names are the HF model's own,
    tied weights included under each of their names. On a one-rank mesh the local shard is
    already the whole tensor: it is yielded as is (a view of the parameter, not a copy),
    without the gather's dispatch, which cost more than the copy on a small model (a
    third of a single worker's weight sync).
    """
    for name, tensor in model.state_dict().items():
        if isinstance(tensor, DTensor):
            local = tensor.to_local()
            whole = tensor.device_mesh.size() == 1 and local.shape == tensor.shape
            yield name, local.contiguous() if whole else tensor.full_tensor()
        else:
            yield name, tensor


def _tied_names(model: PreTrainedModel) -> set[str]:
    """State-dict names that transformers re-ties on load, so export must not duplicate."""
    text_config = model.config.get_text_config()
    if getattr(text_config, "tie_word_embeddings", False):
        return {"lm_head.weight"}
    return set()


def export_hf(
    directory: Path,
    model: PreTrainedModel,
    export: HFExport,
    params: Iterator[tuple[str, torch.Tensor]] | None = None,
) -> None:
    """Write a Hugging Face directory of ``model`` (collective; rank 0 gathers and writes).

    ``export.model_class`` is the transformers class (FSDP2 renames the module's class).
    ``params`` are the ``(name, full tensor)`` pairs to write (default: the model's own;
    a LoRA engine passes its merged weights).
    """
    rank = dist.get_rank()
    skip = _tied_names(model)
    weights: dict[str, torch.Tensor] = {}
    for name, full in params if params is not None else iter_full_params(model):
        if rank == 0 and name not in skip:
            weights[name] = full.detach().to("cpu", copy=True).contiguous()
    if rank == 0:
        generation_config = getattr(model, "generation_config", None)
        write_hf_directory(directory, weights, model.config, export, generation_config)
    dist.barrier()
