"""Checkpoints, Hugging Face export and full-parameter iteration for the Megatron engine.

Checkpoints are sharded as one ``torch.save`` file per rank (that rank's model shard,
optimizer and RNG state) plus ``meta.json``; they resume on the same world size and
tensor / pipeline layout only. For another layout, export to Hugging Face and start from it.
The FSDP engine's counterpart is :mod:`hf_engines.fsdp.checkpoint`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel import get_cuda_rng_tracker
from torch.optim.lr_scheduler import LRScheduler
from transformers import PretrainedConfig

from hf_engines.checkpointing import (
    HFExport,
    load_state_file,
    rng_state,
    set_rng_state,
    write_hf_directory,
)
from hf_engines.config import MegatronConfig
from hf_engines.megatron.convert import mcore_layer_to_hf

_FORMAT = "hf-engines/megatron-per-rank"
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")
_OUTER = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.bias": "score.bias",  # a value head's bias
}


def _layout(config: MegatronConfig) -> dict[str, int | bool]:
    layout: dict[str, int | bool] = {
        "world_size": dist.get_world_size(),
        "tensor_model_parallel_size": config.tensor_model_parallel_size,
        "pipeline_model_parallel_size": config.pipeline_model_parallel_size,
        # each rank's optimizer file holds its share only when the optimizer is distributed
        "use_distributed_optimizer": config.use_distributed_optimizer,
    }
    if config.expert_model_parallel_size > 1:  # absent from dense runs' (older) checkpoints
        layout["expert_model_parallel_size"] = config.expert_model_parallel_size
    return layout


def save(
    directory: Path,
    model: GPTModel,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    global_step: int,
    config: MegatronConfig,
) -> None:
    """Write ``rank<r>.pt`` on every rank and ``meta.json`` on rank 0 (collective)."""
    directory.mkdir(parents=True, exist_ok=True)
    rank = dist.get_rank()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "global_step": global_step,
        "rng": rng_state(),
        "model_parallel_rng": get_cuda_rng_tracker().get_states(),
    }
    torch.save(state, directory / f"rank{rank}.pt")
    if rank == 0:
        meta = {"format": _FORMAT, "global_step": global_step, **_layout(config)}
        (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    dist.barrier()


def load(
    directory: Path,
    model: GPTModel,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    config: MegatronConfig,
) -> int:
    """Restore what :func:`save` wrote (same world size and layout); return the step."""
    meta_file = directory / "meta.json"
    if not meta_file.is_file():
        raise FileNotFoundError(
            f"{directory} holds no hf-engines Megatron checkpoint (no meta.json); pass the "
            "directory given to save_checkpoint"
        )
    meta = json.loads(meta_file.read_text())
    layout = _layout(config)
    saved = {key: meta.get(key) for key in layout}
    if saved["use_distributed_optimizer"] is None:  # saved before the option existed
        saved["use_distributed_optimizer"] = False
    if meta.get("format") != _FORMAT or saved != layout:
        raise ValueError(
            f"checkpoint {directory} was saved with {saved} ({meta.get('format')}); this run "
            f"has {layout}. Resume with the same world size and megatron parallel sizes, or "
            "export_hf and start a new run from the exported model"
        )
    device = next(model.parameters()).device
    state: dict[str, Any] = load_state_file(
        directory / f"rank{dist.get_rank()}.pt", map_location=device
    )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    get_cuda_rng_tracker().set_states(state["model_parallel_rng"])
    return int(state["global_step"])


def iter_hf_params(
    tensors: Iterable[tuple[str, torch.Tensor]],
    hf_names: list[str],
    num_query_groups: int,
    head_dim: int,
    value_head: bool,
    tied_head: bool,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Turn full megatron tensors (global names, model order) into HF ``(name, tensor)``.

    Buffers one decoder layer at a time (q/k/v come from one fused tensor) and yields in
    the order of ``hf_names`` (the HF model's ``state_dict()`` order). With ``tied_head``
    (no output layer: ``lm_head`` is the embedding) the embedding tensor is kept until it
    is yielded again, last, as ``lm_head.weight``, as transformers lists it; otherwise it
    is dropped as soon as the consumer is done with it, so at most one decoder layer (or
    one outer tensor) of gathered weights is alive at a time.
    """
    head = "score.weight" if value_head else "lm_head.weight"
    order = {name: index for index, name in enumerate(hf_names)}
    yielded: set[str] = set()
    embedding: torch.Tensor | None = None
    buffer: dict[str, torch.Tensor] = {}
    current: int | None = None

    def flush() -> Iterator[tuple[str, torch.Tensor]]:
        converted = mcore_layer_to_hf(buffer, num_query_groups, head_dim)
        prefixed = {f"model.layers.{current}.{name}": t for name, t in converted.items()}
        for name in sorted(prefixed, key=lambda n: order.get(n, len(order))):
            yielded.add(name)
            yield name, prefixed[name]

    for name, tensor in tensors:
        match = _LAYER.match(name)
        layer = int(match.group(1)) if match else None
        if buffer and layer != current:
            yield from flush()
            buffer = {}
        current = layer
        if match:
            buffer[match.group(2)] = tensor
            continue
        hf_name = head if name == "output_layer.weight" else _OUTER[name]
        if tied_head and hf_name == "model.embed_tokens.weight":
            embedding = tensor
        yielded.add(hf_name)
        yield hf_name, tensor
        del tensor  # the consumer may drop it: this frame must not keep it alive
    if buffer:
        yield from flush()
        buffer = {}
    if tied_head and head in order and head not in yielded:
        assert embedding is not None
        yielded.add(head)
        yield head, embedding
    if yielded != set(hf_names):
        raise RuntimeError(
            f"weight conversion mismatch: missing {sorted(set(hf_names) - yielded)}, "
            f"unexpected {sorted(yielded - set(hf_names))}"
        )


def export_hf(
    directory: Path,
    params: Iterable[tuple[str, torch.Tensor]],
    hf_config: PretrainedConfig,
    export: HFExport,
) -> None:
    """Write a Hugging Face directory of ``params`` (collective; global rank 0 writes).

    Tied ``lm_head.weight`` is left out, as transformers re-ties it on load.
    """
    rank = dist.get_rank()
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in params:
        if rank == 0 and not (tied and name == "lm_head.weight"):
            weights[name] = tensor.detach().to("cpu", copy=True).contiguous()
    if rank == 0:
        write_hf_directory(directory, weights, hf_config, export)
    dist.barrier()
