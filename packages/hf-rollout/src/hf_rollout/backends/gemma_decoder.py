"""A lean forward pass for Gemma 3 text models, reading the transformers model's weights.

The same maths as ``Gemma3ForCausalLM`` (``model_type`` ``gemma3_text``): embeddings scaled
by ``sqrt(hidden_size)``, RMSNorm with ``(1 + weight)`` before and after attention and the
MLP, per-head q/k norms, ``query_pre_attn_scalar ** -0.5`` attention scaling, a gelu-tanh
gated MLP, sliding-window layers with their own rotary base beside global ones, and the
optional final logit soft-capping, over the preallocated
:class:`~hf_rollout.backends.fast_decoder.KVCache` of the Llama-family decoder. Like it, it
holds references to the model's parameters, never copies. :func:`gemma_supports` says
whether a model qualifies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from hf_rollout.backends.fast_decoder import KVCache, _rotate

GEMMA_MODEL_TYPES = ("gemma3_text",)
_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")


def gemma_supports(config: Any) -> str | None:
    """``None`` when :class:`Gemma3Decoder` reproduces a model of ``config``; else why not."""
    model_type = getattr(config, "model_type", None)
    if model_type not in GEMMA_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {GEMMA_MODEL_TYPES}"
    if getattr(config, "hidden_activation", None) not in _ACTIVATIONS:
        return f"hidden_activation {config.hidden_activation!r} is not gelu-tanh"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "attention logit soft-capping"
    if getattr(config, "use_bidirectional_attention", False):
        return "bidirectional attention"
    rope = getattr(config, "rope_parameters", None) or {}
    types = {str((rope.get(kind) or {}).get("rope_type", "default")) for kind in rope}
    if not types <= {"default", "linear"}:
        return f"rope types {sorted(types)} depend on more than the position"
    return None


@dataclass(frozen=True)
class _GemmaLayer:
    """References to one decoder layer's parameters (shared with the model, never copied)."""

    norms: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    """input, post-attention, pre-feedforward, post-feedforward."""
    q: tuple[torch.Tensor, torch.Tensor | None]
    k: tuple[torch.Tensor, torch.Tensor | None]
    v: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    gate: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]
    kind: str
    """``sliding_attention`` or ``full_attention``."""

    @staticmethod
    def of(layer: Any, kind: str) -> _GemmaLayer:
        """The parameters of a transformers Gemma 3 decoder layer."""
        attn, mlp = layer.self_attn, layer.mlp

        def linear(module: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
            return module.weight, module.bias

        return _GemmaLayer(
            norms=(
                layer.input_layernorm.weight,
                layer.post_attention_layernorm.weight,
                layer.pre_feedforward_layernorm.weight,
                layer.post_feedforward_layernorm.weight,
            ),
            q=linear(attn.q_proj),
            k=linear(attn.k_proj),
            v=linear(attn.v_proj),
            o=linear(attn.o_proj),
            q_norm=attn.q_norm.weight,
            k_norm=attn.k_norm.weight,
            gate=linear(mlp.gate_proj),
            up=linear(mlp.up_proj),
            down=linear(mlp.down_proj),
            kind=kind,
        )


class Gemma3Decoder:
    """The forward pass of a Gemma 3 text model (see :func:`gemma_supports`); the interface
    of :class:`~hf_rollout.backends.fast_decoder.LlamaFamilyDecoder`."""

    def __init__(self, model: torch.nn.Module, max_positions: int) -> None:
        config: Any = model.config
        reason = gemma_supports(config)
        if reason is not None:
            raise ValueError(f"Gemma3Decoder cannot run this model: {reason}")
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(config.head_dim)
        self.eps = float(config.rms_norm_eps)
        self.scaling = float(config.query_pre_attn_scalar) ** -0.5
        self.window = int(config.sliding_window)
        self.softcap: float | None = config.final_logit_softcapping
        inner: Any = model.model
        self.layers = [
            _GemmaLayer.of(layer, kind)
            for layer, kind in zip(inner.layers, config.layer_types, strict=True)
        ]
        self.embed = inner.embed_tokens
        self.norm: torch.Tensor = inner.norm.weight
        head: Any = model.lm_head
        self.lm_head: torch.Tensor = head.weight
        self.rotary = inner.rotary_emb
        self.max_positions = max_positions
        self._tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def _rope_tables(self, like: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        first = next(iter(self._tables.values()), None)
        if first is None or first[0].device != like.device or first[0].dtype != like.dtype:
            positions = torch.arange(self.max_positions, device=like.device)[None]
            self._tables = {}
            for kind in {layer.kind for layer in self.layers}:
                cos, sin = self.rotary(like, positions, kind)
                self._tables[kind] = (cos[0], sin[0])
        return self._tables

    def release_tables(self) -> None:
        """Drop the rotary tables (rebuilt at the next forward), e.g. when the model sleeps."""
        self._tables = {}

    def new_cache(self, rows: int, capacity: int, like: torch.Tensor) -> KVCache:
        """An empty cache for ``rows`` sequences of up to ``capacity`` tokens."""
        shape = (len(self.layers), rows, self.kv_heads, capacity, self.head_dim)
        return KVCache(like.new_zeros(shape), like.new_zeros(shape))

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + weight.float())).type_as(x)

    def _masks(self, key_mask: torch.Tensor, start: int, stop: int) -> dict[str, torch.Tensor]:
        """The ``(B, 1, T, S)`` attention masks of the global and the sliding layers: real
        keys, causal, within the window; a pad query sees itself (never an empty row)."""
        rows, steps = key_mask.shape[0], stop - start
        device = key_mask.device
        queries = torch.arange(start, stop, device=device)[:, None]
        keys = torch.arange(stop, device=device)[None]
        causal = keys <= queries
        real = key_mask[:, None, None, :stop].expand(rows, 1, steps, stop)
        masks = {}
        for kind, visible in (
            ("full_attention", causal),
            ("sliding_attention", causal & (queries - keys < self.window)),
        ):
            masks[kind] = (real & visible) | (queries == keys)
        return masks

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        key_mask: torch.Tensor,
        cache: KVCache,
    ) -> torch.Tensor:
        """Logits ``(B, V)`` of the last position; appends ``T`` tokens to ``cache`` (see
        :meth:`~hf_rollout.backends.fast_decoder.LlamaFamilyDecoder.forward`)."""
        start, stop = cache.length, cache.length + input_ids.shape[1]
        hidden = self.embed(input_ids)  # the transformers module scales it already
        rope = {
            kind: (cos[position_ids][:, None], sin[position_ids][:, None])
            for kind, (cos, sin) in self._rope_tables(hidden).items()
        }
        masks = self._masks(key_mask, start, stop)
        for index, layer in enumerate(self.layers):
            x = self._rms_norm(hidden, layer.norms[0])
            x = self._attention(layer, index, x, rope[layer.kind], masks[layer.kind], cache)
            hidden = hidden + self._rms_norm(x, layer.norms[1])
            x = self._rms_norm(hidden, layer.norms[2])
            x = F.gelu(F.linear(x, *layer.gate), approximate="tanh") * F.linear(x, *layer.up)
            hidden = hidden + self._rms_norm(F.linear(x, *layer.down), layer.norms[3])
        cache.length = stop
        logits = F.linear(self._rms_norm(hidden[:, -1], self.norm), self.lm_head)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _attention(
        self,
        layer: _GemmaLayer,
        index: int,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
        cache: KVCache,
    ) -> torch.Tensor:
        rows, steps, _ = x.shape
        start, stop = cache.length, cache.length + steps
        q = F.linear(x, *layer.q).view(rows, steps, self.heads, self.head_dim).transpose(1, 2)
        k = F.linear(x, *layer.k).view(rows, steps, self.kv_heads, self.head_dim).transpose(1, 2)
        v = F.linear(x, *layer.v).view(rows, steps, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self._rms_norm(q, layer.q_norm), self._rms_norm(k, layer.k_norm)
        q, k = _rotate(q, *rope), _rotate(k, *rope)
        cache.keys[index, :, :, start:stop] = k
        cache.values[index, :, :, start:stop] = v
        keys, values = cache.keys[index, :, :, :stop], cache.values[index, :, :, :stop]
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=self.scaling,
            enable_gqa=self.kv_heads != self.heads,
        )  # fmt: skip
        return F.linear(out.transpose(1, 2).reshape(rows, steps, -1), *layer.o)
