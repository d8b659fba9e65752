"""``dpo``: the DPO loss and, for online DPO, how pairs are made.

Each section checks its own values in ``__post_init__``; checks that need several
sections are in :mod:`hf_algos.config.cross_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_algos.config.values import require_positive
from hf_controller import ConfigurationError


@dataclass(frozen=True)
class DPOSection:
    """DPO loss and, for online DPO, how pairs are made."""

    beta: float = 0.1
    """Inverse temperature of the implicit reward."""
    loss_type: str = "sigmoid"
    """DPO loss variant in ``hf_algos.losses.dpo`` (sigmoid, ipo, hinge, ...)."""
    label_smoothing: float = 0.0
    """Conservative-DPO label noise."""
    online: bool = False
    """Sample ``rollout.n`` responses per prompt, score them and pair best against worst."""
    mini_batch_size: int = 8
    """Pairs per optimizer step, over all ranks."""

    def __post_init__(self) -> None:
        require_positive("dpo.beta", self.beta)
        require_positive("dpo.mini_batch_size", self.mini_batch_size)
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ConfigurationError(
                f"dpo.label_smoothing={self.label_smoothing!r} must be in [0, 0.5)"
            )
