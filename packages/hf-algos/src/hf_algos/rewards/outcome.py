"""The result of scoring one sample, as a scoring process sends it back to the manager."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ScoringOutcome:
    """The result of scoring one sample."""

    score: float = 0.0
    """The score (0.0 when the function failed). Inside a scoring process only, a function
    of a weighted list (:mod:`hf_algos.rewards.weighted`) that returned ``None`` for the
    sample (it does not apply, TRL's convention) has ``nan`` here until the weighted sum
    leaves it out."""
    extras: dict[str, float] = field(default_factory=dict)
    """Extra numbers the function returned beside ``"score"``."""
    status: str = "ok"
    """``"ok"``, ``"error"`` (it raised or returned something unusable), ``"timeout"``,
    ``"skipped"`` (not scored: the samples before it timed out in a row), or ``"fatal"``
    (the function cannot be loaded or called with the batch's fields: the manager raises
    instead of scoring)."""
    error: str = ""
    """What went wrong: the exception and the end of its traceback."""
