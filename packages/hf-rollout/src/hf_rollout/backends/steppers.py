"""One decoding step at a time over a KV cache, in two flavours for the native backend.

``TransformersStepper`` calls the transformers model with a ``DynamicCache`` (any causal LM);
``LeanStepper`` runs :class:`~hf_rollout.backends.fast_decoder.LlamaFamilyDecoder` or
:class:`~hf_rollout.backends.gemma_decoder.Gemma3Decoder` over a preallocated cache
(Llama-family and Gemma 3 models, much less Python per step). Both keep one cache row
per active sequence and can drop finished rows. Both can also start from reused keys and
values (``past``, see :mod:`~hf_rollout.backends.prefix_cache`) and hand out the cache of
chosen rows (``snapshot``); the transformers one only when every cache layer is a plain
full-attention ``DynamicLayer`` (:func:`transformers_can_reuse`).
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from hf_rollout.backends.fast_decoder import KVCache, LlamaFamilyDecoder
from hf_rollout.backends.gemma_decoder import Gemma3Decoder
from hf_rollout.backends.prefix_cache import PastKV


class Stepper(Protocol):
    """Prefill once, then extend every active row by one token per step."""

    def prefill(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past: PastKV | None = None,
    ) -> torch.Tensor:
        """Last-position logits ``(B, V)`` of the left-padded prompts ``(B, P)``.

        With ``past`` (``H`` columns), the prompts continue those keys and values and
        ``attention_mask`` is ``(B, H + P)``.
        """
        ...

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, V)`` after appending ``tokens`` ``(B,)`` at ``positions`` ``(B,)``."""
        ...

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop every cache row not in ``rows``."""
        ...

    def repeat_rows(self, times: int) -> None:
        """Replace every cache row by ``times`` consecutive copies of it (after a prefill,
        for the samples of one prompt)."""
        ...

    def snapshot(self, rows: torch.Tensor) -> PastKV:
        """Keys, values and column mask of cache ``rows`` (every column fed so far)."""
        ...


def transformers_can_reuse(config: Any) -> bool:
    """Whether a ``DynamicCache`` of ``config`` holds only plain full-attention layers,
    whose keys and values can be handed between calls (sliding-window, linear-attention
    and other layer kinds cannot)."""
    try:
        layers = DynamicCache(config=config).layers
    except (TypeError, ValueError, AttributeError):
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword the model's ``forward`` takes its KV cache by: ``cache`` where the model
    has it (transformers 5.25 renamed ``past_key_values``, which now warns on every call),
    else ``past_key_values`` (older transformers, models not yet moved over)."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward whose signature cannot be read
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


class TransformersStepper:
    """Steps through the transformers forward with a ``DynamicCache``.

    Sliding-window layers (Gemma 3, Mistral with a window) keep only their last window of
    keys and values; the attention mask still spans every column fed, as transformers
    expects, and row selection and repeats apply to every layer kind alike.
    """

    def __init__(self, model: torch.nn.Module, config: Any) -> None:
        self.model = model
        self.cache = DynamicCache(config=config)
        self.cache_keyword = cache_keyword(model)
        self.attention_mask = torch.zeros(0, 0, dtype=torch.long)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        output = self.model(
            input_ids=ids,
            attention_mask=self.attention_mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_keyword: self.cache},
        )
        logits: torch.Tensor = output.logits[:, -1, :]
        return logits

    def prefill(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past: PastKV | None = None,
    ) -> torch.Tensor:
        """See :class:`Stepper`."""
        if past is not None:
            for index in range(past.keys.shape[0]):
                self.cache.update(past.keys[index], past.values[index], index)
        self.attention_mask = attention_mask
        return self._forward(input_ids, position_ids)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """See :class:`Stepper`."""
        ones = self.attention_mask.new_ones((len(tokens), 1))
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)
        return self._forward(tokens[:, None], positions[:, None])

    def keep_rows(self, rows: torch.Tensor) -> None:
        """See :class:`Stepper`."""
        self.cache.batch_select_indices(rows)
        self.attention_mask = self.attention_mask[rows]

    def repeat_rows(self, times: int) -> None:
        """See :class:`Stepper`."""
        self.cache.batch_repeat_interleave(times)
        self.attention_mask = self.attention_mask.repeat_interleave(times, dim=0)

    def snapshot(self, rows: torch.Tensor) -> PastKV:
        """See :class:`Stepper`."""
        layers: Any = self.cache.layers
        keys = torch.stack([layer.keys[rows] for layer in layers])
        values = torch.stack([layer.values[rows] for layer in layers])
        return PastKV(keys, values, self.attention_mask[rows].bool())


LeanDecoder = LlamaFamilyDecoder | Gemma3Decoder
"""A lean forward: the model's maths over a preallocated :class:`KVCache`."""


class LeanStepper:
    """Steps through a :data:`LeanDecoder` over a cache sized for the whole call."""

    def __init__(self, decoder: LeanDecoder, capacity: int) -> None:
        self.decoder = decoder
        self.capacity = capacity
        self.cache: KVCache | None = None
        self.key_mask = torch.zeros(0, 0, dtype=torch.bool)

    def prefill(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past: PastKV | None = None,
    ) -> torch.Tensor:
        """See :class:`Stepper` (``capacity`` counts the past columns too)."""
        rows = input_ids.shape[0]
        like = self.decoder.lm_head
        self.cache = self.decoder.new_cache(rows, self.capacity, like)
        if past is not None:
            start = past.keys.shape[3]
            self.cache.keys[:, :, :, :start] = past.keys
            self.cache.values[:, :, :, :start] = past.values
            self.cache.length = start
        self.key_mask = torch.zeros(rows, self.capacity, dtype=torch.bool, device=like.device)
        self.key_mask[:, : attention_mask.shape[1]] = attention_mask.bool()
        return self.decoder.forward(input_ids, position_ids, self.key_mask, self.cache)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """See :class:`Stepper`."""
        assert self.cache is not None
        self.key_mask[:, self.cache.length] = True
        return self.decoder.forward(tokens[:, None], positions[:, None], self.key_mask, self.cache)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """See :class:`Stepper`."""
        assert self.cache is not None
        self.cache.select_rows(rows)
        self.key_mask = self.key_mask[rows]

    def repeat_rows(self, times: int) -> None:
        """See :class:`Stepper`."""
        assert self.cache is not None
        self.cache.repeat_rows(times)
        self.key_mask = self.key_mask.repeat_interleave(times, dim=0)

    def snapshot(self, rows: torch.Tensor) -> PastKV:
        """See :class:`Stepper`."""
        assert self.cache is not None
        length = self.cache.length
        return PastKV(
            self.cache.keys[:, rows, :, :length],
            self.cache.values[:, rows, :, :length],
            self.key_mask[rows, :length],
        )
