"""``critic``: the value model of PPO with GAE, its engine and value loss.

Each section checks its own values in ``__post_init__``; checks that need several
sections are in :mod:`hf_algos.config.cross_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_algos.config.values import require_positive
from hf_engines.config import EngineConfig


@dataclass(frozen=True)
class CriticSection:
    """The value model (PPO with GAE only)."""

    engine: EngineConfig
    """Model (``head`` is forced to ``value``), optimizer and layout of the critic."""
    ppo_mini_batch_size: int = 8
    """Rows per critic optimizer step, over all ranks together."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    cliprange_value: float = 0.5
    """Clip of the value update around the old values."""
    loss_agg_mode: str = "token-mean"
    """How token losses are reduced."""

    def __post_init__(self) -> None:
        require_positive("critic.ppo_mini_batch_size", self.ppo_mini_batch_size)
        require_positive("critic.ppo_epochs", self.ppo_epochs)
        require_positive("critic.cliprange_value", self.cliprange_value)
