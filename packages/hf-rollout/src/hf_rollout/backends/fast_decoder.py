"""A lean forward pass for Llama-family decoders, reading the transformers model's weights.

For small models the Python overhead of a transformers forward (module calls, mask
building, cache objects) costs more than the arithmetic. This module runs the same maths
as ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` / ``MistralForCausalLM``
(RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP) as a handful of tensor
ops per layer over a preallocated KV cache. It holds references to the model's parameters,
never copies, so weight updates of the model apply at once. :func:`supports` says whether a
model qualifies; the native backend falls back to the transformers forward otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
_POSITION_ONLY_ROPE = ("default", "linear", "llama3", "yarn")


def _rope_type(config: Any) -> str:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    return str((rope or {}).get("rope_type", (rope or {}).get("type", "default")))


def supports(model: torch.nn.Module, max_positions: int) -> str | None:
    """``None`` when the lean forward reproduces ``model`` for sequences up to
    ``max_positions`` tokens; else the reason it does not."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} is not silu"  # type: ignore[union-attr]
    if _rope_type(config) not in _POSITION_ONLY_ROPE:
        return f"rope type {_rope_type(config)!r} depends on more than the position"
    window = getattr(config, "sliding_window", None)
    windowed = getattr(config, "use_sliding_window", model_type == "mistral")
    if windowed and window is not None and window < max_positions:
        return f"sliding-window attention (window {window} < {max_positions} positions)"
    return None


@dataclass(frozen=True)
class _Layer:
    """References to one decoder layer's parameters (shared with the model, never copied)."""

    input_norm: torch.Tensor
    q: tuple[torch.Tensor, torch.Tensor | None]
    k: tuple[torch.Tensor, torch.Tensor | None]
    v: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor
    gate: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]

    @staticmethod
    def of(layer: Any) -> _Layer:
        """The parameters of a transformers decoder layer."""
        attn, mlp = layer.self_attn, layer.mlp

        def linear(module: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
            return module.weight, module.bias

        q_norm = getattr(attn, "q_norm", None)
        k_norm = getattr(attn, "k_norm", None)
        return _Layer(
            input_norm=layer.input_layernorm.weight,
            q=linear(attn.q_proj),
            k=linear(attn.k_proj),
            v=linear(attn.v_proj),
            o=linear(attn.o_proj),
            q_norm=None if q_norm is None else q_norm.weight,
            k_norm=None if k_norm is None else k_norm.weight,
            post_norm=layer.post_attention_layernorm.weight,
            gate=linear(mlp.gate_proj),
            up=linear(mlp.up_proj),
            down=linear(mlp.down_proj),
        )


@dataclass
class KVCache:
    """Keys and values of every layer, ``(layers, B, kv_heads, capacity, head_dim)`` each."""

    keys: torch.Tensor
    values: torch.Tensor
    length: int = 0

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch ``rows`` (finished rows leave the cache)."""
        self.keys = self.keys[:, rows]
        self.values = self.values[:, rows]

    def repeat_rows(self, times: int) -> None:
        """Each batch row becomes ``times`` consecutive copies (samples of one prompt)."""
        self.keys = self.keys.repeat_interleave(times, dim=1)
        self.values = self.values.repeat_interleave(times, dim=1)


class LlamaFamilyDecoder:
    """The forward pass of a supported transformers causal LM (see :func:`supports`)."""

    def __init__(self, model: torch.nn.Module, max_positions: int) -> None:
        reason = supports(model, max_positions)
        if reason is not None:
            raise ValueError(f"LlamaFamilyDecoder cannot run this model: {reason}")
        self.model = model
        config: Any = model.config
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.eps = float(config.rms_norm_eps)
        inner: Any = model.model
        self.layers = [_Layer.of(layer) for layer in inner.layers]
        self.embed = inner.embed_tokens
        self.norm: torch.Tensor = inner.norm.weight
        head: Any = model.lm_head
        self.lm_head: torch.Tensor = head.weight
        self.rotary = inner.rotary_emb
        self.max_positions = max_positions
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def _rope_tables(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cos is None or self._cos.device != like.device or self._cos.dtype != like.dtype:
            positions = torch.arange(self.max_positions, device=like.device)[None]
            cos, sin = self.rotary(like, positions)
            self._cos, self._sin = cos[0], sin[0]
        assert self._sin is not None
        return self._cos, self._sin

    def release_tables(self) -> None:
        """Drop the rotary tables (rebuilt at the next forward), e.g. when the model sleeps."""
        self._cos = self._sin = None

    def new_cache(self, rows: int, capacity: int, like: torch.Tensor) -> KVCache:
        """An empty cache for ``rows`` sequences of up to ``capacity`` tokens."""
        shape = (len(self.layers), rows, self.kv_heads, capacity, self.head_dim)
        return KVCache(like.new_zeros(shape), like.new_zeros(shape))

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        key_mask: torch.Tensor,
        cache: KVCache,
    ) -> torch.Tensor:
        """Logits ``(B, V)`` of the last position; appends ``T`` tokens to ``cache``.

        ``input_ids`` and ``position_ids`` are ``(B, T)``; ``key_mask`` ``(B, S)`` is True
        for real tokens among the ``S = cache.length + T`` cached positions.
        """
        rows, steps = input_ids.shape
        start, stop = cache.length, cache.length + steps
        hidden = self.embed(input_ids)
        cos_table, sin_table = self._rope_tables(hidden)
        cos, sin = cos_table[position_ids][:, None], sin_table[position_ids][:, None]
        mask = key_mask[:, None, None, :stop].expand(rows, 1, steps, stop)
        if steps > 1:  # prefill: causal, and pad queries see themselves (never an empty row)
            causal = torch.ones(steps, stop, dtype=torch.bool, device=hidden.device).tril(start)
            mask = mask & causal
            rows_at = torch.arange(start, stop, device=hidden.device)[:, None]
            mask = mask | (rows_at == torch.arange(stop, device=hidden.device)[None])
        for index, layer in enumerate(self.layers):
            hidden = hidden + self._attention(
                layer, index, self._rms_norm(hidden, layer.input_norm),
                cos, sin, mask, cache, start, stop,
            )  # fmt: skip
            x = self._rms_norm(hidden, layer.post_norm)
            gated = F.silu(F.linear(x, *layer.gate)) * F.linear(x, *layer.up)
            hidden = hidden + F.linear(gated, *layer.down)
        cache.length = stop
        return F.linear(self._rms_norm(hidden[:, -1], self.norm), self.lm_head)

    def _attention(
        self,
        layer: _Layer,
        index: int,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache,
        start: int,
        stop: int,
    ) -> torch.Tensor:
        rows, steps, _ = x.shape
        q = F.linear(x, *layer.q).view(rows, steps, self.heads, self.head_dim).transpose(1, 2)
        k = F.linear(x, *layer.k).view(rows, steps, self.kv_heads, self.head_dim).transpose(1, 2)
        v = F.linear(x, *layer.v).view(rows, steps, self.kv_heads, self.head_dim).transpose(1, 2)
        if layer.q_norm is not None and layer.k_norm is not None:  # Qwen3: per-head RMSNorm
            q = self._rms_norm(q, layer.q_norm)
            k = self._rms_norm(k, layer.k_norm)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        cache.keys[index, :, :, start:stop] = k
        cache.values[index, :, :, start:stop] = v
        keys, values = cache.keys[index, :, :, :stop], cache.values[index, :, :, :stop]
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, enable_gqa=self.kv_heads != self.heads
        )
        return F.linear(out.transpose(1, 2).reshape(rows, steps, -1), *layer.o)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding: ``x * cos + rotate_half(x) * sin``."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
