"""Weight conversion between Hugging Face Llama / Qwen2 / Qwen3 and megatron-core ``GPTModel``.

Three pure steps, each exact (only copies, splits and concatenations):

* :func:`hf_to_mcore` / :func:`mcore_to_hf`: whole state dicts, HF names <-> megatron names
  with *global* layer numbers. Megatron fuses q/k/v into ``linear_qkv`` (per query group:
  that group's query heads, then its key head, then its value head) and gate/up into
  ``linear_fc1`` (all gate rows, then all up rows).
* :func:`tp_shard` / :func:`tp_merge`: one full megatron tensor <-> its tensor-parallel
  shards (columns for ``linear_qkv`` / ``linear_fc1`` / embeddings / output layer, rows of
  ``linear_proj`` / ``linear_fc2``; norms are replicated).

Qwen3-MoE layers' routed experts are converted by :mod:`hf_engines.megatron.moe`.
Names are those of megatron's local layer spec; the Transformer Engine spec keeps the two
pre-norms inside the following linear layer, see :func:`te_name`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hf_engines.megatron.moe import hf_moe_to_mcore, is_moe_layer, mcore_moe_to_hf

Tensor = torch.Tensor

_LAYER_NORMS = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}
"""HF layer-local name -> megatron layer-local name, for tensors copied unchanged."""

# Tensor-parallel split dimension by megatron name suffix; absent = replicated.
_COLUMN_PARALLEL = (
    "linear_qkv.weight",
    "linear_qkv.bias",
    "linear_fc1.weight",
    "word_embeddings.weight",
    "output_layer.weight",
)
_ROW_PARALLEL = ("linear_proj.weight", "linear_fc2.weight")

_TE_RENAMES = {
    ".input_layernorm.weight": ".self_attention.linear_qkv.layer_norm_weight",
    ".pre_mlp_layernorm.weight": ".mlp.linear_fc1.layer_norm_weight",
}


def te_name(name: str) -> str:
    """The Transformer Engine spec's name for a local-spec megatron name."""
    for local, fused in _TE_RENAMES.items():
        if name.endswith(local):
            return name[: -len(local)] + fused
    return name


def _fuse_qkv(q: Tensor, k: Tensor, v: Tensor, groups: int) -> Tensor:
    """Interleave per query group: ``[q_g, k_g, v_g]`` for g in groups (rows; dim 0)."""
    q_groups = q.reshape(groups, -1, *q.shape[1:])
    k_groups = k.reshape(groups, -1, *k.shape[1:])
    v_groups = v.reshape(groups, -1, *v.shape[1:])
    return torch.cat([q_groups, k_groups, v_groups], dim=1).reshape(-1, *q.shape[1:])


def _split_qkv(qkv: Tensor, groups: int, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of :func:`_fuse_qkv`; returns contiguous ``q, k, v``."""
    per_group = qkv.reshape(groups, -1, *qkv.shape[1:])
    q_rows = per_group.shape[1] - 2 * head_dim
    q, k, v = per_group.split([q_rows, head_dim, head_dim], dim=1)
    return (
        q.reshape(-1, *qkv.shape[1:]).contiguous(),
        k.reshape(-1, *qkv.shape[1:]).contiguous(),
        v.reshape(-1, *qkv.shape[1:]).contiguous(),
    )


def hf_layer_to_mcore(hf_layer: Mapping[str, Tensor], num_query_groups: int) -> dict[str, Tensor]:
    """One decoder layer: HF layer-local names (``self_attn.q_proj.weight``...) -> megatron's."""
    out: dict[str, Tensor] = {}
    for hf_name, mc_name in _LAYER_NORMS.items():
        if hf_name in hf_layer:
            out[mc_name] = hf_layer[hf_name]
    for kind in ("weight", "bias"):
        if f"self_attn.q_proj.{kind}" in hf_layer:
            q, k, v = (hf_layer[f"self_attn.{p}_proj.{kind}"] for p in "qkv")
            out[f"self_attention.linear_qkv.{kind}"] = _fuse_qkv(q, k, v, num_query_groups)
    if is_moe_layer(hf_layer):
        out.update(hf_moe_to_mcore(hf_layer))
        return out
    gate, up = hf_layer["mlp.gate_proj.weight"], hf_layer["mlp.up_proj.weight"]
    out["mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
    return out


def mcore_layer_to_hf(
    mcore_layer: Mapping[str, Tensor], num_query_groups: int, head_dim: int
) -> dict[str, Tensor]:
    """Inverse of :func:`hf_layer_to_mcore` (layer-local names on both sides)."""
    out: dict[str, Tensor] = {}
    for kind in ("weight", "bias"):
        qkv = mcore_layer.get(f"self_attention.linear_qkv.{kind}")
        if qkv is not None:
            for proj, tensor in zip(
                "qkv", _split_qkv(qkv, num_query_groups, head_dim), strict=True
            ):
                out[f"self_attn.{proj}_proj.{kind}"] = tensor
    for hf_name, mc_name in _LAYER_NORMS.items():
        if mc_name in mcore_layer:
            out[hf_name] = mcore_layer[mc_name]
    if "mlp.router.weight" in mcore_layer:
        out.update(mcore_moe_to_hf(mcore_layer))
        return out
    gate, up = mcore_layer["mlp.linear_fc1.weight"].chunk(2, dim=0)
    out["mlp.gate_proj.weight"] = gate.contiguous()
    out["mlp.up_proj.weight"] = up.contiguous()
    return out


def _sub(state: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {name[len(prefix) :]: t for name, t in state.items() if name.startswith(prefix)}


def same_storage(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` view one storage (tied weights), also for meta tensors.

    Meta tensors have no data pointer (every one reads 0), but tied parameters still share
    one storage object, which ``state_dict()``'s detached views keep.
    """
    if a.is_meta or b.is_meta:
        return a.is_meta and b.is_meta and a.untyped_storage()._cdata == b.untyped_storage()._cdata
    return a.data_ptr() == b.data_ptr()


def hf_to_mcore(
    hf_state: Mapping[str, Tensor], num_layers: int, num_query_groups: int, value_head: bool
) -> dict[str, Tensor]:
    """A whole HF state dict as megatron names (global layer numbers); tensors are shared.

    ``value_head`` reads the ``*ForTokenClassification`` ``score`` layer as the output layer.
    A tied ``lm_head`` (absent, or the same tensor as the embeddings) gives no output layer.
    """
    embed = hf_state["model.embed_tokens.weight"]
    out: dict[str, Tensor] = {"embedding.word_embeddings.weight": embed}
    for layer in range(num_layers):
        converted = hf_layer_to_mcore(_sub(hf_state, f"model.layers.{layer}."), num_query_groups)
        out.update({f"decoder.layers.{layer}.{name}": t for name, t in converted.items()})
    out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"]
    head = hf_state.get("score.weight" if value_head else "lm_head.weight")
    if head is not None and (value_head or not same_storage(head, embed)):
        out["output_layer.weight"] = head
    if value_head and "score.bias" in hf_state:
        out["output_layer.bias"] = hf_state["score.bias"]
    return out


def mcore_to_hf(
    mcore_state: Mapping[str, Tensor],
    num_layers: int,
    num_query_groups: int,
    head_dim: int,
    value_head: bool,
) -> dict[str, Tensor]:
    """Inverse of :func:`hf_to_mcore`.

    Without an output layer (tied embeddings) ``lm_head.weight`` is the embedding tensor,
    as transformers lists it in ``state_dict()``.
    """
    embed = mcore_state["embedding.word_embeddings.weight"]
    out: dict[str, Tensor] = {"model.embed_tokens.weight": embed}
    for layer in range(num_layers):
        layer_state = _sub(mcore_state, f"decoder.layers.{layer}.")
        converted = mcore_layer_to_hf(layer_state, num_query_groups, head_dim)
        out.update({f"model.layers.{layer}.{name}": t for name, t in converted.items()})
    out["model.norm.weight"] = mcore_state["decoder.final_layernorm.weight"]
    out["score.weight" if value_head else "lm_head.weight"] = mcore_state.get(
        "output_layer.weight", embed
    )
    if "output_layer.bias" in mcore_state:
        out["score.bias"] = mcore_state["output_layer.bias"]
    return out


def tp_split_dim(name: str) -> int | None:
    """The dimension a megatron tensor is split along over tensor-parallel ranks, or None."""
    if name.endswith(_COLUMN_PARALLEL):
        return 0
    if name.endswith(_ROW_PARALLEL):
        return 1
    return None


def tp_shard(name: str, full: Tensor, tp_rank: int, tp_size: int) -> Tensor:
    """Tensor-parallel rank ``tp_rank``'s shard of the full megatron tensor ``name``.

    ``linear_fc1`` is split per half, so each rank holds matching gate and up rows; a value
    head's 1-row output layer is replicated.
    """
    dim = tp_split_dim(name)
    if dim is None or tp_size == 1 or (name.endswith("output_layer.weight") and full.shape[0] == 1):
        return full
    if name.endswith("linear_fc1.weight"):
        halves = [half.chunk(tp_size, dim=0)[tp_rank] for half in full.chunk(2, dim=0)]
        return torch.cat(halves, dim=0)
    return full.chunk(tp_size, dim=dim)[tp_rank].contiguous()


def tp_merge(name: str, shards: list[Tensor]) -> Tensor:
    """Inverse of :func:`tp_shard`: the full tensor from every rank's shard, in rank order."""
    dim = tp_split_dim(name)
    if (
        dim is None
        or len(shards) == 1
        or (name.endswith("output_layer.weight") and shards[0].shape[0] == 1)
    ):
        return shards[0]
    if name.endswith("linear_fc1.weight"):
        halves = [shard.chunk(2, dim=0) for shard in shards]
        gate = torch.cat([h[0] for h in halves], dim=0)
        up = torch.cat([h[1] for h in halves], dim=0)
        return torch.cat([gate, up], dim=0)
    return torch.cat(shards, dim=dim)
