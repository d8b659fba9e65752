"""``algorithm``: the advantage estimator and what shapes the rewards before it
(``algorithm.kl_ctrl``, ``algorithm.filter_groups``).

``algorithm.rollout_correction`` is :mod:`hf_algos.config.correction`.

Each section checks its own values in ``__post_init__``; checks that need several
sections are in :mod:`hf_algos.config.cross_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hf_algos.config.correction import RolloutCorrectionSection
from hf_algos.config.values import require_positive
from hf_controller import ConfigurationError


@dataclass(frozen=True)
class KLControlSection:
    """KL penalty in the reward (``algorithm.use_kl_in_reward``)."""

    type: Literal["fixed", "adaptive"] = "fixed"
    """A fixed coefficient, or one adapted toward ``target_kl``."""
    kl_coef: float = 0.001
    """The (initial) coefficient."""
    target_kl: float = 0.1
    """Adaptive only: the KL to track."""
    horizon: float = 10000.0
    """Adaptive only: steps over which the coefficient adapts."""

    def __post_init__(self) -> None:
        require_positive("algorithm.kl_ctrl.kl_coef", self.kl_coef, allow_zero=True)
        require_positive("algorithm.kl_ctrl.target_kl", self.target_kl)
        require_positive("algorithm.kl_ctrl.horizon", self.horizon)


@dataclass(frozen=True)
class FilterGroupsSection:
    """DAPO dynamic sampling (``algorithm.filter_groups``, verl's keys): drop the prompt groups
    whose samples all score alike (zero advantage under a group baseline), and draw more
    prompts until a step has ``data.train_batch_size`` groups that teach something."""

    enable: bool = False
    """Filter groups after scoring."""
    metric: str = "score"
    """Per-sequence value compared within a group: ``score`` (``token_level_scores`` summed
    over the response) or a key of the reward function's ``reward_extra_info`` (e.g.
    ``acc``)."""
    max_num_gen_batches: int = 0
    """Prompt batches one step may generate before it trains on what it has; 0 means up to
    one epoch's worth of batches (the hard cap)."""

    def __post_init__(self) -> None:
        require_positive(
            "algorithm.filter_groups.max_num_gen_batches", self.max_num_gen_batches, True
        )
        if not self.metric:
            raise ConfigurationError(
                "algorithm.filter_groups.metric is empty; use 'score' or a key of the reward "
                "function's extra info (e.g. 'acc')"
            )


@dataclass(frozen=True)
class AlgorithmSection:
    """Advantage estimation and the reward-side KL penalty."""

    adv_estimator: str = "grpo"
    """Estimator in ``hf_algos.advantages.ADVANTAGE_ESTIMATORS``; one that reads ``values``
    (gae) needs a critic section, one that groups by prompt (grpo, rloo) ``rollout.n >= 2``."""
    gamma: float = 1.0
    """Discount."""
    lam: float = 1.0
    """GAE lambda."""
    norm_adv_by_std: bool = True
    """GRPO: divide by the group's standard deviation (False gives Dr. GRPO; verl:
    ``norm_adv_by_std_in_grpo``)."""
    use_kl_in_reward: bool = False
    """Subtract ``beta * KL(policy || reference)`` from the token rewards."""
    kl_penalty: str = "kl"
    """KL estimator of the reward penalty."""
    kl_ctrl: KLControlSection = field(default_factory=KLControlSection)
    """The penalty's coefficient controller."""
    filter_groups: FilterGroupsSection = field(default_factory=FilterGroupsSection)
    """DAPO dynamic sampling: train only on prompt groups whose samples differ."""
    rollout_correction: RolloutCorrectionSection = field(default_factory=RolloutCorrectionSection)
    """Importance weights for the rollout/trainer mismatch (TIS / MIS); off by default."""
