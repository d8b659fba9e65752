"""``algorithm.rollout_correction``: importance weights for rollout/trainer mismatch.

A section of its own, as every section has (:mod:`hf_algos.config.algorithm` holds the rest of
``algorithm``); the math is in
:mod:`hf_algos.losses.rollout_correction`, and ``docs/guides/algos.md`` says when to use it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from hf_controller import ConfigurationError


@dataclass(frozen=True)
class RolloutCorrectionSection:
    """Reweight the policy loss by the ratio of the trainer's recomputed log-probs
    (``old_log_probs``) over the rollout's own (``rollout_log_probs``), truncated (TIS) or
    masked outside a band (MIS). ``off`` still logs the mismatch metrics.

    Resolved for the run (:meth:`resolved`), the section is what the actor loss and the
    trainer take; its fields are the keywords of
    :func:`~hf_algos.losses.rollout_correction.compute_rollout_correction`. Small and
    picklable, so the actor loss carries it to the workers."""

    mode: Literal["auto", "off", "tis", "mis"] = "auto"
    """``auto``: ``tis`` with ``trainer.async_mode`` one_step_off / fully_async (the samples
    are a version or more old; see docs/async.md), ``off`` in the synchronous loop;
    ``off``: no weights; ``tis``: weight ``min(ratio, rollout_is_cap)``; ``mis``: weight
    ``ratio`` inside ``[mis_low, mis_high]``, 0 outside (the token or sequence is dropped
    from the policy loss)."""
    level: Literal["token", "sequence"] = "token"
    """A ratio per token, or per sequence (the geometric mean of its token ratios, applied
    to all its tokens)."""
    rollout_is_cap: float = 2.0
    """TIS: the largest weight (> 0; 2.0 is the literature's usual value)."""
    mis_low: float = 0.5
    """MIS: ratios below this are masked (0 <= mis_low < 1)."""
    mis_high: float = 2.0
    """MIS: ratios above this are masked (> 1)."""

    def __post_init__(self) -> None:
        if self.rollout_is_cap <= 0:
            raise ConfigurationError(
                f"algorithm.rollout_correction.rollout_is_cap={self.rollout_is_cap!r} must be "
                "> 0 (e.g. 2.0)"
            )
        if not 0 <= self.mis_low < 1 < self.mis_high:
            raise ConfigurationError(
                f"algorithm.rollout_correction: the MIS band [mis_low={self.mis_low!r}, "
                f"mis_high={self.mis_high!r}] must contain 1 with 0 <= mis_low < 1 < mis_high "
                "(e.g. mis_low=0.5, mis_high=2.0)"
            )

    @property
    def enabled(self) -> bool:
        """Whether the policy loss is reweighted (``mode`` is ``tis`` or ``mis``; resolve
        ``auto`` first with :meth:`resolved`)."""
        return self.mode in ("tis", "mis")

    def resolved(self, async_mode: str) -> RolloutCorrectionSection:
        """This section with ``auto`` made concrete for ``trainer.async_mode``: ``tis`` for
        an async mode (off-policy samples), ``off`` for the synchronous loop."""
        if self.mode != "auto":
            return self
        return replace(self, mode=auto_mode(async_mode))


def auto_mode(async_mode: str) -> Literal["off", "tis"]:
    """What ``mode=auto`` means under ``trainer.async_mode``: ``tis`` for an async mode
    (off-policy samples), ``off`` for the synchronous loop."""
    return "off" if async_mode == "off" else "tis"


def check_rollout_correction(
    section: RolloutCorrectionSection, use_rollout_log_probs: bool
) -> None:
    """A correction needs two different log-probs: refuse it when ``old_log_probs`` *are*
    the rollout's (``actor.use_rollout_log_probs``), where every ratio would be 1."""
    if section.enabled and use_rollout_log_probs:
        raise ConfigurationError(
            f"algorithm.rollout_correction.mode={section.mode!r} compares the actor's recomputed "
            "old_log_probs with the rollout's rollout_log_probs, but actor.use_rollout_log_probs"
            "=true uses the rollout's as old_log_probs (every ratio would be 1); set "
            "actor.use_rollout_log_probs=false or algorithm.rollout_correction.mode=off"
        )
