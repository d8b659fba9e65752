"""Ulysses sequence parallelism: the collectives and the attention function.

An SP group of ``sp`` ranks shares one packed sequence, each rank holding ``1/sp`` of its
tokens. Everything but attention is per token, so it runs on the local shard. Attention
needs every token: before it an all-to-all trades the sequence shards for head shards
(each rank then holds ``heads/sp`` heads of the whole sequence), and after it a second
all-to-all trades them back (DeepSpeed-Ulysses, arXiv:2309.14509). FSDP is unaffected:
it still shards the weights over all ranks.

The attention function is registered with transformers' ``AttentionInterface`` under
:data:`ATTENTION_NAME`; it reads its process group and the packed rows' boundaries from the
``ulysses_group`` and ``ulysses_bounds`` keywords, which the model's forward passes down to
every attention layer (also when activation checkpointing recomputes a block).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import init_device_mesh
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

from hf_engines.config import ConfigurationError, EngineConfig

ATTENTION_NAME = "hf_ulysses_sdpa"
"""The attention implementation a sequence-parallel model runs with."""

_SUPPORTED_KERNELS = ("sdpa", "eager")


class _AllToAll(torch.autograd.Function):
    """Split ``x`` along ``scatter_dim`` over the group, concatenate the parts received
    along ``gather_dim``; the backward is the same exchange the other way round."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int, group: ProcessGroup
    ) -> torch.Tensor:
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        size = dist.get_world_size(group)
        send = torch.stack(x.chunk(size, dim=scatter_dim))  # (size, ...), contiguous
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=group)
        return torch.cat(received.unbind(0), dim=gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        scatter_dim, gather_dim = ctx.dims
        return _AllToAll.apply(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all(
    x: torch.Tensor, scatter_dim: int, gather_dim: int, group: ProcessGroup
) -> torch.Tensor:
    """Autograd-aware all-to-all: ``x.shape[scatter_dim]`` shrinks by the group size and
    ``x.shape[gather_dim]`` grows by it."""
    size = dist.get_world_size(group)
    if x.shape[scatter_dim] % size:
        raise ValueError(
            f"dimension {scatter_dim} of {tuple(x.shape)} does not split over {size} ranks"
        )
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)


class _GatherShards(torch.autograd.Function):
    """Concatenate every rank's equal-sized shard along ``dim``. Backward: each rank's
    loss may read any shard, so the gradients are summed over the group, then each rank
    keeps its own shard's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: ProcessGroup) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        total = grad.contiguous()
        dist.all_reduce(total, group=ctx.group)
        size, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return total.chunk(size, dim=ctx.dim)[rank], None, None


def gather_shards(x: torch.Tensor, dim: int, group: ProcessGroup) -> torch.Tensor:
    """The group's shards of ``x`` concatenated along ``dim``, in rank order (autograd-aware)."""
    return _GatherShards.apply(x, dim, group)


def ulysses_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal SDPA over each packed sequence of the whole group, on ``heads/sp`` heads.

    ``query``/``key``/``value``: ``(1, heads, S, D)``, the local slice. The keywords
    ``ulysses_group`` (the SP group) and ``ulysses_bounds`` (where each packed sequence
    starts in the group's ``sp*S`` tokens, then ``sp*S``) come from the model's forward.
    Each sequence attends causally on its own (SDPA's memory-efficient kernels, no
    ``(sp*S)**2`` mask). Returns ``(1, S, heads, D)``, as transformers expects.
    """
    group = kwargs.pop("ulysses_group", None)
    bounds = kwargs.pop("ulysses_bounds", None)
    if group is None or bounds is None or attention_mask is not None:
        raise RuntimeError(
            f"attention {ATTENTION_NAME!r} needs the ulysses_group and ulysses_bounds "
            "keywords and no attention mask; run the model through "
            "hf_engines.fsdp.sp_forward, not directly"
        )
    # Scatter heads, gather the sequence: (1, heads/sp, sp*S, D).
    query, key, value = (all_to_all(t, 1, 2, group) for t in (query, key, value))
    parts = [
        sdpa_attention_forward(
            module,
            query[:, :, start:stop],
            key[:, :, start:stop],
            value[:, :, start:stop],
            None,
            is_causal=True,
            **kwargs,
        )[0]
        for start, stop in pairwise(bounds)
    ]
    # (1, sp*S, heads/sp, D): scatter the sequence, gather the heads back.
    return all_to_all(torch.cat(parts, dim=1), 1, 2, group), None


def _no_mask(**kwargs: Any) -> None:
    """The mask function of :data:`ATTENTION_NAME`: it attends per packed sequence."""
    return None


def sequence_parallel_group(size: int, device_type: str) -> ProcessGroup | None:
    """This rank's SP group: ``size`` consecutive ranks (``None`` for ``size == 1``).

    Every rank of the default group must call it (each builds every group).
    """
    if size == 1:
        return None
    world = dist.get_world_size()
    if world % size:
        raise ConfigurationError(
            f"fsdp.ulysses_sequence_parallel_size={size} does not divide world_size={world}; "
            f"choose a divisor of {world}"
        )
    mesh = init_device_mesh(device_type, (world // size, size), mesh_dim_names=("sp_dp", "sp"))
    return mesh.get_group("sp")


def enable_ulysses(model: PreTrainedModel, config: EngineConfig) -> None:
    """Switch ``model`` to :func:`ulysses_attention`, or raise what it cannot split."""
    size = config.fsdp.ulysses_sequence_parallel_size
    kernel = config.model.attn_implementation
    if kernel not in _SUPPORTED_KERNELS:
        raise ConfigurationError(
            f"fsdp.ulysses_sequence_parallel_size={size} supports model.attn_implementation "
            f"{' or '.join(_SUPPORTED_KERNELS)}, not {kernel!r} (it attends with SDPA, one "
            "packed sequence at a time); set model.attn_implementation=sdpa"
        )
    if config.model.remove_padding not in ("auto", "pack"):
        raise ConfigurationError(
            f"fsdp.ulysses_sequence_parallel_size={size} splits packed tokens; "
            f"model.remove_padding={config.model.remove_padding!r} must be auto or pack"
        )
    heads = model.config.num_attention_heads
    kv_heads = getattr(model.config, "num_key_value_heads", None) or heads
    if heads % size or kv_heads % size:
        raise ConfigurationError(
            f"fsdp.ulysses_sequence_parallel_size={size} must divide the attention heads "
            f"({heads}) and the key/value heads ({kv_heads}) of {config.model.path}; choose "
            "a common divisor"
        )
    AttentionInterface.register(ATTENTION_NAME, ulysses_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    model.set_attn_implementation(ATTENTION_NAME)
