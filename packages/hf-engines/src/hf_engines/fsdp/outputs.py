"""Model outputs for a loss function, with entropy computed only when it is read.

Entropy over the vocabulary costs about as much again as the log-softmax; most policy
losses never read it, so a training step skips it unless the loss function asks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from hf_engines.engine import ModelOutputs

Compute = Callable[[], torch.Tensor]


class LazyOutputs(dict[str, torch.Tensor]):
    """A ``ModelOutputs`` dict whose ``lazy`` entries are computed on first read.

    ``outputs["entropy"]``, ``outputs.get("entropy")`` and ``"entropy" in outputs`` all see
    a lazy entry; iterating the dict lists only the entries computed so far.
    """

    def __init__(self, ready: dict[str, torch.Tensor], lazy: dict[str, Compute]) -> None:
        super().__init__(ready)
        self.lazy = dict(lazy)

    def __missing__(self, key: str) -> torch.Tensor:
        if key not in self.lazy:
            raise KeyError(key)
        value = self.lazy.pop(key)()
        self[key] = value
        return value

    def __contains__(self, key: object) -> bool:
        return key in self.lazy or super().__contains__(key)

    def get(self, key: str, default: Any = None) -> Any:
        """The entry (computing a lazy one), or ``default``."""
        if key not in self:
            return default
        return self[key]


def map_outputs(
    outputs: ModelOutputs, function: Callable[[torch.Tensor], torch.Tensor]
) -> ModelOutputs:
    """``outputs`` with ``function`` applied to each tensor, lazy entries staying lazy."""
    ready: dict[str, torch.Tensor] = {
        key: function(value) for key, value in cast(dict[str, torch.Tensor], outputs).items()
    }
    lazy: dict[str, Compute] = {}
    if isinstance(outputs, LazyOutputs):
        for key, compute in outputs.lazy.items():
            lazy[key] = lambda compute=compute: function(compute())  # type: ignore[misc]
    return cast(ModelOutputs, LazyOutputs(ready, lazy))


def token_log_probs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> ModelOutputs:
    """``log_probs`` of ``targets`` at ``temperature``, and ``entropy`` on demand.

    Both come from one log-softmax (which autograd keeps anyway), so the lazy entropy
    holds no extra memory.

    Shape: logits ``(B, R, V)``, targets ``(B, R)`` -> ``(B, R)`` each, float32.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature!r} must be > 0")
    if logits.shape[:2] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not line up with targets {tuple(targets.shape)}"
        )
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    log_softmax = torch.log_softmax(scaled, dim=-1)
    log_probs = log_softmax.gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    def entropy() -> torch.Tensor:
        return -(log_softmax.exp() * log_softmax).sum(dim=-1)

    return cast(ModelOutputs, LazyOutputs({"log_probs": log_probs}, {"entropy": entropy}))
