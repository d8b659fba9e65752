"""Gradient reduction over data-parallel replicas, and global-norm clipping, for megatron.

Without sequence parallelism every tensor-parallel rank computes identical gradients for
its replicated parameters (layer norms, a value head): the column-parallel layers after
them already sum their input gradients. The exceptions are the per-head q/k norms (each
rank sees only its heads), summed over tensor-parallel ranks here, along with data-parallel
replicas and the pipeline's two copies of tied embeddings. Routed experts (mixture of
experts) are summed over their own replicas, the expert-data-parallel ranks.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from hf_engines.megatron.moe import is_expert_param

_PER_HEAD_SHARED = ("q_layernorm.weight", "k_layernorm.weight")


def _grads(model: GPTModel, experts: bool | None = None) -> list[torch.Tensor]:
    """Gradients of every trainable parameter, zeros where a parameter got none; only the
    routed experts' (``experts=True``) or only the others' (``False``) when asked."""
    grads = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if experts is not None and is_expert_param(name) != experts:
            continue
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        grads.append(param.grad)
    return grads


def _all_reduce(grads: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Sum ``grads`` over ``group`` in place, as one flat tensor."""
    if dist.get_world_size(group) == 1 or not grads:
        return
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(reduced)


def reduce_gradients(model: GPTModel) -> None:
    """Sum gradients over data-parallel replicas and over tied-embedding copies (in place).

    Losses are already weighted by each replica's share of the tokens, so a sum (not a mean)
    gives the gradient of the whole mini-batch.
    """
    # Routed experts live on one expert-parallel rank each: their replicas are the
    # expert-data-parallel ranks (the data-parallel ones divided by the expert-parallel size).
    _all_reduce(_grads(model, experts=False), parallel_state.get_data_parallel_group())
    _all_reduce(_grads(model, experts=True), parallel_state.get_expert_data_parallel_group())
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        # q/k norms are shared by all heads, and each tensor-parallel rank holds only some
        # heads: their gradient is the sum of every rank's part.
        for name, param in model.named_parameters():
            if param.grad is not None and name.endswith(_PER_HEAD_SHARED):
                dist.all_reduce(param.grad, group=parallel_state.get_tensor_model_parallel_group())
    pipeline = parallel_state.get_pipeline_model_parallel_world_size() > 1
    tied = model.share_embeddings_and_output_weights
    if pipeline and tied and parallel_state.is_rank_in_embedding_group():
        weight = model.shared_embedding_or_output_weight()
        assert weight.grad is not None
        dist.all_reduce(weight.grad, group=parallel_state.get_embedding_group())


def clip_gradients(model: GPTModel, max_norm: float | None) -> float:
    """Clip the global gradient norm to ``max_norm`` (``None``: no clip); return the norm.

    Each gradient element is counted once over the model-parallel group: tensor-parallel
    duplicates and the pipeline's second copy of tied embeddings are left out of the norm.
    """
    device = next(model.parameters()).device
    squares = torch.zeros(1, dtype=torch.float64, device=device)
    expert_squares = torch.zeros(1, dtype=torch.float64, device=device)
    for name, param in model.named_parameters():
        if param.grad is None or not param_is_not_shared(param):
            continue
        if is_expert_param(name):
            expert_squares += param.grad.detach().double().pow(2).sum()
        elif param_is_not_tensor_parallel_duplicate(param):
            squares += param.grad.detach().double().pow(2).sum()
    dist.all_reduce(squares, group=parallel_state.get_model_parallel_group())
    # Each expert is held by one rank of its expert-parallel (x pipeline) group.
    dist.all_reduce(
        expert_squares, group=parallel_state.get_expert_tensor_model_pipeline_parallel_group()
    )
    norm = math.sqrt(float((squares + expert_squares).item()))
    if max_norm is not None and math.isfinite(norm):
        coefficient = max_norm / (norm + 1e-6)
        if coefficient < 1.0:
            for grad in _grads(model):
                grad.mul_(coefficient)
    return norm
