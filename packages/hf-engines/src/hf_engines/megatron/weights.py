"""Moving full Hugging Face weights into a megatron model stage, and gathering them back."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

from hf_engines.megatron.convert import tp_merge, tp_shard, tp_split_dim
from hf_engines.megatron.moe import broadcast_expert, expert_owner, global_expert_name
from hf_engines.megatron.parallel import pipeline_rank_of_stage, tensor_parallel_gather

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")


def local_to_global_names(model: GPTModel) -> dict[str, str]:
    """This stage's parameter names -> names with global layer (and expert) numbers.

    Transformer Engine names (pre-norms fused into the next linear layer) are mapped back to
    the local spec's, so the converter sees one naming.
    """
    offsets = {i: int(layer.layer_number) - 1 for i, layer in enumerate(model.decoder.layers)}
    names: dict[str, str] = {}
    for name in model.state_dict(keep_vars=True):
        if name.endswith("_extra_state"):
            continue
        canonical = name.replace(
            "self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"
        ).replace("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight")
        match = _LAYER.match(canonical)
        if match:
            canonical = f"decoder.layers.{offsets[int(match.group(1))]}.{match.group(2)}"
        names[name] = global_expert_name(model, canonical)
    return names


@torch.no_grad()
def load_full_weights(model: GPTModel, full: Mapping[str, torch.Tensor]) -> None:
    """Copy this rank's shard of every tensor of ``full`` (global megatron names) into ``model``.

    Every parameter of the stage must be found in ``full`` (an error names what is missing).
    With tied embeddings the last pipeline stage's output layer takes the embeddings.
    """
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    state = model.state_dict(keep_vars=True)
    tied = {"output_layer.weight": "embedding.word_embeddings.weight"}
    for local, global_name in local_to_global_names(model).items():
        source = global_name
        if source not in full and model.share_embeddings_and_output_weights:
            source = tied.get(global_name, global_name)
        if source not in full:
            raise KeyError(
                f"no weight for megatron parameter {global_name!r}; the converter produced "
                f"{sorted(full)[:8]}..."
            )
        copy_shard(state[local], tp_shard(global_name, full[source], tp_rank, tp_size), global_name)


def copy_shard(target: torch.Tensor, shard: torch.Tensor, global_name: str) -> None:
    """Copy this rank's ``shard`` of megatron tensor ``global_name`` into parameter ``target``.

    Also marks ``target`` as split over tensor-parallel ranks or replicated (see
    :func:`_mark_tensor_parallel`). A shard of the wrong shape is an error naming both shapes.
    """
    if tuple(target.shape) != tuple(shard.shape):
        raise ValueError(
            f"{global_name}: converted shard {tuple(shard.shape)} does not fit the "
            f"model's {tuple(target.shape)}"
        )
    with torch.no_grad():
        target.copy_(shard)
    value_head = global_name.endswith("output_layer.weight") and shard.shape[0] == 1
    split = (
        parallel_state.get_tensor_model_parallel_world_size() > 1
        and tp_split_dim(global_name) is not None
        and not value_head
    )
    _mark_tensor_parallel(target, global_name, split)


def _mark_tensor_parallel(param: torch.Tensor, global_name: str, split: bool) -> None:
    """Set megatron's ``tensor_model_parallel`` attributes, which the gradient norm reads.

    megatron sets them only while initialising weights itself, which this engine skips
    (``perform_initialization=False``: the weights come from the HF model).
    """
    if hasattr(param, "tensor_model_parallel"):
        return
    dim = tp_split_dim(global_name)
    set_tensor_model_parallel_attributes(param, split, -1 if dim is None else dim, 1)


def _owner_stage(global_name: str, num_layers: int, pp_size: int) -> int:
    """The pipeline stage holding ``global_name`` (uniform split of layers over stages)."""
    match = _LAYER.match(global_name)
    if match:
        return int(match.group(1)) // (num_layers // pp_size)
    return 0 if global_name.startswith("embedding.") else pp_size - 1


def _full_from_tensor_parallel(name: str, shard: torch.Tensor) -> torch.Tensor:
    """The full tensor ``name`` from this rank's ``shard`` (collective over the tensor-
    parallel group for split tensors).

    A tensor that is not split (norms, routers, row-parallel biases) is the same on every
    tensor-parallel rank, so it is copied locally instead of gathered: no collective, and
    the tensor handed on is not a buffer the communication library may still hold.
    """
    if tp_split_dim(name) is None and parallel_state.get_tensor_model_parallel_world_size() > 1:
        return shard.clone()
    return tp_merge(name, tensor_parallel_gather(shard))


def iter_full_tensors(
    model: GPTModel,
    shapes: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
    num_layers: int,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(global megatron name, full tensor)`` in ``shapes`` order, on every rank.

    Collective over the whole model-parallel group: each tensor is gathered over tensor-
    parallel ranks on its owning stage (a routed expert: broadcast from the expert-parallel
    rank holding it), then broadcast along the pipeline.
    """
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    device = next(model.parameters()).device
    local = {global_name: name for name, global_name in local_to_global_names(model).items()}
    state = model.state_dict()
    for name, (shape, dtype) in shapes.items():
        owner = _owner_stage(name, num_layers, pp_size)
        if pp_rank == owner and expert_owner(model, name) is not None:
            held = state[local[name]] if name in local else None
            full = broadcast_expert(model, name, held, shape)
        elif pp_rank == owner:
            full = _full_from_tensor_parallel(name, state[local[name]].detach())
        else:
            full = torch.empty(shape, dtype=dtype, device=device)
        if pp_size > 1:
            dist.broadcast(
                full,
                src=pipeline_rank_of_stage(owner),
                group=parallel_state.get_pipeline_model_parallel_group(),
            )
        yield name, full
