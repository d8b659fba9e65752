"""Mixture-of-experts layers (Qwen3-MoE) in megatron-core: names, expert parallelism, padding.

HF keeps a layer's experts as two 3-D tensors, ``mlp.experts.gate_up_proj`` ``(E, 2I, H)``
(gate rows, then up rows) and ``mlp.experts.down_proj`` ``(E, H, I)``, plus the router
``mlp.gate.weight`` ``(E, H)``. Megatron's ``SequentialMLP`` holds one MLP per local expert,
``mlp.experts.local_experts.<j>.linear_fc1.weight`` ``(2I, H)`` (the same gate-then-up
layout) and ``linear_fc2.weight`` ``(H, I)``, and the router ``mlp.router.weight``.

Full (converted) state dicts name experts by their *global* index ``e``; expert-parallel
rank ``r`` of ``P`` holds experts ``r * E/P ... (r + 1) * E/P - 1`` as local ``j = e - r*E/P``.

The ``allgather`` token dispatcher gathers every expert-parallel rank's tokens in each MoE
layer, forward and backward, with equal shapes on every rank: :func:`align_micro_batches`
pads this rank's micro-batches to the group's largest shape and adds fillers, so every rank
runs the same number of equally shaped passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch
import torch.distributed as dist
from megatron.core import parallel_state

Tensor = torch.Tensor
_EXPERT = re.compile(r"^((?:.*\.)?mlp\.experts\.local_experts\.)(\d+)(\..*)$")
Item = TypeVar("Item")


def allow_router_without_transformer_engine() -> None:
    """Let megatron's router run without Transformer Engine (idempotent).

    megatron-core 0.16's ``moe_utils`` reads ``te_general_gemm`` in the router's linear
    layer but defines it only when Transformer Engine imports; ``None`` picks its
    ``torch.mm`` path.
    """
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def is_moe_layer(hf_layer: Mapping[str, Tensor]) -> bool:
    """Whether an HF decoder layer (layer-local names) has a routed MoE MLP."""
    return "mlp.gate.weight" in hf_layer


def hf_moe_to_mcore(hf_layer: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The MoE MLP of one HF layer as megatron layer-local names (global expert numbers)."""
    gate_up, down = hf_layer["mlp.experts.gate_up_proj"], hf_layer["mlp.experts.down_proj"]
    out = {"mlp.router.weight": hf_layer["mlp.gate.weight"]}
    for expert in range(gate_up.shape[0]):
        prefix = f"mlp.experts.local_experts.{expert}."
        out[prefix + "linear_fc1.weight"] = gate_up[expert]
        out[prefix + "linear_fc2.weight"] = down[expert]
    return out


def mcore_moe_to_hf(mcore_layer: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of :func:`hf_moe_to_mcore` (stacks the experts back into 3-D tensors)."""
    experts = sorted(
        index
        for name in mcore_layer
        if name.endswith("linear_fc1.weight") and (index := expert_index(name)) is not None
    )
    if experts != list(range(len(experts))):
        raise ValueError(f"expert numbers {experts} are not 0..{len(experts) - 1}")
    fc1 = [mcore_layer[f"mlp.experts.local_experts.{e}.linear_fc1.weight"] for e in experts]
    fc2 = [mcore_layer[f"mlp.experts.local_experts.{e}.linear_fc2.weight"] for e in experts]
    return {
        "mlp.gate.weight": mcore_layer["mlp.router.weight"],
        "mlp.experts.gate_up_proj": torch.stack(fc1),
        "mlp.experts.down_proj": torch.stack(fc2),
    }


def expert_index(name: str) -> int | None:
    """The expert number in a megatron expert parameter's name, or None for other names."""
    match = _EXPERT.match(name)
    return int(match.group(2)) if match else None


def with_expert_index(name: str, expert: int) -> str:
    """``name`` (an expert parameter) with its expert number replaced by ``expert``."""
    match = _EXPERT.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a megatron expert parameter name")
    return f"{match.group(1)}{expert}{match.group(3)}"


def _local_experts(model: torch.nn.Module) -> int:
    """Experts per expert-parallel rank (0 for a dense model)."""
    config = getattr(model, "config", None)
    total = int(getattr(config, "num_moe_experts", None) or 0)
    return total // parallel_state.get_expert_model_parallel_world_size()


def global_expert_name(model: torch.nn.Module, name: str) -> str:
    """A local expert parameter name with this rank's global expert number (others as is)."""
    local = expert_index(name)
    if local is None:
        return name
    offset = parallel_state.get_expert_model_parallel_rank() * _local_experts(model)
    return with_expert_index(name, offset + local)


def expert_owner(model: torch.nn.Module, global_name: str) -> int | None:
    """The expert-parallel rank holding a global expert name (None: not an expert)."""
    expert = expert_index(global_name)
    return None if expert is None else expert // _local_experts(model)


def broadcast_expert(
    model: torch.nn.Module, global_name: str, local: Tensor | None, shape: tuple[int, ...]
) -> Tensor:
    """The full expert tensor ``global_name`` on every expert-parallel rank (collective).

    ``local`` is this rank's copy when it holds the expert, else None.
    """
    owner = expert_owner(model, global_name)
    assert owner is not None, global_name
    group = parallel_state.get_expert_model_parallel_group()
    if parallel_state.get_expert_model_parallel_world_size() == 1:
        assert local is not None
        return local
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    full = local.detach().clone() if local is not None else torch.empty(shape, dtype=dtype)
    full = full.to(device)
    dist.broadcast(full, src=dist.get_process_group_ranks(group)[owner], group=group)
    return full


def is_expert_param(name: str) -> bool:
    """Whether a megatron parameter name is a routed expert's weight (held by one
    expert-parallel rank, so reduced over the expert-data-parallel ranks only)."""
    return "mlp.experts." in name


def align_micro_batches(
    items: list[Item],
    shape_of: Callable[[Item], tuple[int, int]],
    pad: Callable[[Item, int, int], Item],
    filler: Callable[[Item], Item],
    device: torch.device,
) -> tuple[list[Item], int]:
    """Pad ``items`` to the expert-parallel group's largest ``(rows, length)`` and add
    fillers up to its largest count; return them and how many are real (collective).

    ``shape_of`` gives an item's ``(rows, length)``, ``pad(item, rows, length)`` an item
    of that shape, ``filler(item)`` a loss-free item like ``item``.
    """
    if parallel_state.get_expert_model_parallel_world_size() == 1:
        return items, len(items)
    rows = max(shape_of(item)[0] for item in items)
    length = max(shape_of(item)[1] for item in items)
    sizes = torch.tensor([len(items), rows, length], dtype=torch.int64, device=device)
    dist.all_reduce(
        sizes, op=dist.ReduceOp.MAX, group=parallel_state.get_expert_model_parallel_group()
    )
    count, rows, length = (int(v) for v in sizes.tolist())
    padded = [pad(item, rows, length) for item in items]
    padded += [pad(filler(items[0]), rows, length) for _ in range(count - len(items))]
    return padded, len(items)


def pad_rows(tensor: Tensor, rows: int, length: int) -> Tensor:
    """``(b, T)`` ``tensor`` zero-padded at the end to ``(rows, length)``."""
    out = tensor.new_zeros((rows, length))
    out[: tensor.shape[0], : tensor.shape[1]] = tensor
    return out


__all__ = [
    "align_micro_batches",
    "allow_router_without_transformer_engine",
    "broadcast_expert",
    "expert_index",
    "expert_owner",
    "global_expert_name",
    "hf_moe_to_mcore",
    "is_expert_param",
    "is_moe_layer",
    "mcore_moe_to_hf",
    "pad_rows",
    "with_expert_index",
]
