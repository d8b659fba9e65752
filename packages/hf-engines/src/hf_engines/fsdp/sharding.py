"""Placing a model on a device mesh with FSDP2 (``fully_shard``)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from transformers import PreTrainedModel

from hf_engines.config import FSDPConfig
from hf_engines.distributed import resolve_compute_device
from hf_engines.models import transformer_blocks


def resolve_device(config: FSDPConfig) -> torch.device:
    """The compute device: CUDA when asked, or with ``auto`` when the backend is NCCL."""
    return resolve_compute_device(config.device, "fsdp")


def build_mesh(config: FSDPConfig, device_type: str) -> DeviceMesh:
    """A 1-D ``("dp_shard",)`` mesh, or 2-D ``("dp_replicate", "dp_shard")`` for HSDP."""
    replicate, shard = config.mesh_shape(dist.get_world_size())
    if replicate == 1:
        return init_device_mesh(device_type, (shard,), mesh_dim_names=("dp_shard",))
    return init_device_mesh(
        device_type, (replicate, shard), mesh_dim_names=("dp_replicate", "dp_shard")
    )


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder block in backward, non-reentrant (it composes with FSDP2's
    per-block all-gathers). transformers 5.25 renamed the switch to
    ``activation_checkpointing_enable`` and warns on every call of the old name, which
    older 5.x releases (the GPU image's 5.17) still need."""
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def shard_model(model: PreTrainedModel, mesh: DeviceMesh, config: FSDPConfig) -> None:
    """Apply ``fully_shard`` to each group of ``config.blocks_per_unit`` consecutive
    transformer blocks, then to the root, in place.

    Sharding per block (the default) lets FSDP2 gather one block's parameters at a time;
    the root holds the rest (embeddings, final norm, head). With ``blocks_per_unit=0``
    only the root is sharded, so the whole model is one unit.
    """
    param_dtype = getattr(torch, config.param_dtype)
    reduce_dtype = getattr(torch, config.reduce_dtype)
    mixed_precision = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    offload = CPUOffloadPolicy() if config.cpu_offload else OffloadPolicy()
    if config.activation_checkpointing:
        enable_activation_checkpointing(model)
    blocks = list(transformer_blocks(model))
    step = config.blocks_per_unit  # 0: no unit below the root
    units = [blocks[start : start + step] for start in range(0, len(blocks), step)] if step else []
    for unit in units:
        fully_shard(
            unit[0] if len(unit) == 1 else unit,
            mesh=mesh,
            mp_policy=mixed_precision,
            offload_policy=offload,
            reshard_after_forward=config.reshard_after_forward,
        )
    fully_shard(
        model,
        mesh=mesh,
        mp_policy=mixed_precision,
        offload_policy=offload,
        reshard_after_forward=config.reshard_after_forward,
    )


def syncs_at_last_micro_batch(config: FSDPConfig, world_size: int) -> bool:
    """Whether gradients are reduced once per step, after the last micro-batch
    (``fsdp.gradient_sync``; ``auto`` where that holds no more memory than sharding)."""
    if config.gradient_sync != "auto":
        return config.gradient_sync == "last_micro_batch"
    _, shard = config.mesh_shape(world_size)
    return shard == 1 and not config.cpu_offload


def defer_gradient_sync(model: FSDPModule, last: bool, keep_gathered: bool) -> None:
    """Before a micro-batch's backward: reduce its gradients only if it is the ``last`` of
    the step; before then accumulate them unsharded (FSDP2's ``no_sync``).

    With ``keep_gathered`` the gathered parameters also stay from one micro-batch to the
    next. They are resharded after the last one, so the optimizer step reaches the next
    forward.
    """
    model.set_requires_gradient_sync(last)
    if keep_gathered:
        model.set_reshard_after_backward(last)
