"""The registry of advantage estimators, by name.

An entry records the estimator function and, read from its signature, which batch fields it
consumes (``token_level_rewards``, ``values``, ``response_mask``, ``reward_baselines``,
``index``) and which keyword hyper-parameters it accepts (``gamma``, ``lam``, ...). What a
run must provide follows from those inputs alone, so registering an estimator is the only
edit a new one needs: reading ``values`` asks for a critic, ``reward_baselines`` for a greedy
baseline rollout, ``index`` for groups of ``rollout.n >= 2`` responses per prompt. Config
validation and the PPO trainer read these properties; nothing else lists estimators.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import torch

from hf_algos.advantages import estimators
from hf_protocol import fields

#: Estimator parameters that are read from the batch; everything else is a hyper-parameter.
BATCH_INPUTS: Final[tuple[str, ...]] = (
    fields.TOKEN_LEVEL_REWARDS,
    fields.VALUES,
    fields.RESPONSE_MASK,
    fields.REWARD_BASELINES,
    "index",
)

EstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
"""``fn(<batch inputs>, *, <hyper-parameters>) -> (advantages, returns)``."""


@dataclass(frozen=True)
class AdvantageEstimator:
    """One registered estimator."""

    name: str
    """The registry key, e.g. ``"grpo"``."""
    fn: EstimatorFn
    """The pure function computing ``(advantages, returns)``."""

    @property
    def inputs(self) -> tuple[str, ...]:
        """The batch fields ``fn`` takes (``index`` is the ``uid`` column)."""
        return tuple(p for p in inspect.signature(self.fn).parameters if p in BATCH_INPUTS)

    @property
    def needs_critic(self) -> bool:
        """Whether ``fn`` reads ``values``, so a run needs a value model (a ``critic`` section)."""
        return fields.VALUES in self.inputs

    @property
    def needs_greedy_baseline(self) -> bool:
        """Whether ``fn`` reads ``reward_baselines``: the score of a greedy answer per prompt,
        which the trainer gets from one extra greedy rollout a step (ReMax)."""
        return fields.REWARD_BASELINES in self.inputs

    @property
    def min_group_size(self) -> int:
        """Fewest responses per prompt (``rollout.n``) that ``fn`` can use.

        An estimator that reads ``index`` compares each response with the others of its
        prompt's group, so it needs 2; with one response per prompt it degenerates (no
        baseline, or the raw score). Any other estimator works on single responses.
        """
        return 2 if "index" in self.inputs else 1

    @property
    def hyperparameters(self) -> dict[str, object]:
        """The keyword hyper-parameters ``fn`` accepts, with their defaults."""
        return {
            name: param.default
            for name, param in inspect.signature(self.fn).parameters.items()
            if name not in BATCH_INPUTS
        }


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
"""Estimators by name; add one with :func:`register_advantage_estimator`."""


def register_advantage_estimator(name: str, fn: EstimatorFn) -> None:
    """Add ``fn`` under ``name``; a name used twice is an error.

    ``fn`` names its batch inputs with the parameter names of :data:`BATCH_INPUTS` and takes
    every other parameter as a keyword hyper-parameter.
    """
    if name in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} is already registered; pick another name")
    ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(name, fn)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator called ``name``; the error lists the registered names."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        known = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {known}") from None


register_advantage_estimator("gae", estimators.compute_gae_advantage_return)
register_advantage_estimator("grpo", estimators.compute_grpo_outcome_advantage)
register_advantage_estimator("rloo", estimators.compute_rloo_outcome_advantage)
register_advantage_estimator(
    "reinforce_plus_plus", estimators.compute_reinforce_plus_plus_advantage
)
register_advantage_estimator(
    "reinforce_plus_plus_baseline", estimators.compute_reinforce_plus_plus_baseline_advantage
)
register_advantage_estimator("remax", estimators.compute_remax_outcome_advantage)
