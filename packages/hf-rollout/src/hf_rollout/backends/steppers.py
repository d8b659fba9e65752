"""One decoding step at a time over a KV cache, in two flavours for the native backend.

``TransformersStepper`` calls the transformers model with a ``DynamicCache`` (any causal LM);
``LeanStepper`` runs :class:`~hf_rollout.backends.fast_decoder.LlamaFamilyDecoder` over a
preallocated cache (Llama-family models, much less Python per step). Both keep one cache row
per active sequence and can drop finished rows.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from transformers import DynamicCache

from hf_rollout.backends.fast_decoder import KVCache, LlamaFamilyDecoder


class Stepper(Protocol):
    """Prefill once, then extend every active row by one token per step."""

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Last-position logits ``(B, V)`` of the left-padded prompts ``(B, P)``."""
        ...

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, V)`` after appending ``tokens`` ``(B,)`` at ``positions`` ``(B,)``."""
        ...

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop every cache row not in ``rows``."""
        ...


class TransformersStepper:
    """Steps through the transformers forward with a ``DynamicCache``."""

    def __init__(self, model: torch.nn.Module, config: Any) -> None:
        self.model = model
        self.cache = DynamicCache(config=config)
        self.attention_mask = torch.zeros(0, 0, dtype=torch.long)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        output = self.model(
            input_ids=ids,
            attention_mask=self.attention_mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits: torch.Tensor = output.logits[:, -1, :]
        return logits

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """See :class:`Stepper`."""
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


class LeanStepper:
    """Steps through :class:`LlamaFamilyDecoder` over a cache sized for the whole call."""

    def __init__(self, decoder: LlamaFamilyDecoder, capacity: int) -> None:
        self.decoder = decoder
        self.capacity = capacity
        self.cache: KVCache | None = None
        self.key_mask = torch.zeros(0, 0, dtype=torch.bool)

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """See :class:`Stepper`."""
        rows, width = input_ids.shape
        like = self.decoder.lm_head
        self.cache = self.decoder.new_cache(rows, self.capacity, like)
        self.key_mask = torch.zeros(rows, self.capacity, dtype=torch.bool, device=like.device)
        self.key_mask[:, :width] = attention_mask.bool()
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
