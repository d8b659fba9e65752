"""What runs inside a scoring process: one call of a scoring function, under an alarm.

The alarm (``SIGALRM``) interrupts a function that sleeps or loops in Python, so a slow
sample costs its own timeout and the worker stays usable. A function stuck where signals
are not handled (inside C code, or one that blocks the alarm) is caught by the manager's
hard deadline instead, which replaces the whole pool.
"""

from __future__ import annotations

import math
import signal
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hf_algos.rewards.registry import ScoreFn, ScoreResult


@dataclass
class ScoringOutcome:
    """The result of scoring one sample."""

    score: float = 0.0
    """The score (0.0 when the function failed)."""
    extras: dict[str, float] = field(default_factory=dict)
    """Extra numbers the function returned beside ``"score"``."""
    status: str = "ok"
    """``"ok"``, ``"error"`` (it raised or returned something unusable) or ``"timeout"``."""
    error: str = ""
    """What went wrong: the exception and the end of its traceback."""


class ScoringTimeoutError(Exception):
    """Raised inside the scoring function by the alarm."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise ScoringTimeoutError


def parse_score(result: ScoreResult) -> tuple[float, dict[str, float]]:
    """``(score, extras)`` from a number or a ``{"score": ..., **extras}`` mapping."""
    if isinstance(result, Mapping):
        if "score" not in result:
            raise ValueError(f"scoring function returned {result!r:.120} without a 'score' key")
        extras = {str(k): float(v) for k, v in result.items() if k != "score"}
        score = float(result["score"])
    else:
        score, extras = float(result), {}
    if not math.isfinite(score):
        raise ValueError(f"scoring function returned a non-finite score {score!r}")
    return score, extras


def run_scoring(
    fn: ScoreFn,
    solution: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None,
    timeout_s: float,
) -> ScoringOutcome:
    """Call ``fn`` with an alarm of ``timeout_s`` seconds; never raises for ``fn``'s faults."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        score, extras = parse_score(fn(solution, ground_truth, extra_info))
        outcome = ScoringOutcome(score=score, extras=extras)
    except ScoringTimeoutError:
        outcome = ScoringOutcome(status="timeout", error=f"no result within {timeout_s:g} s")
    except (Exception, SystemExit) as error:
        lines = traceback.format_exception(error)
        outcome = ScoringOutcome(status="error", error="".join(lines[-3:]).strip())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return outcome


ScoringJob = tuple[ScoreFn, str, Any, "Mapping[str, Any] | None", float]
"""One sample's ``(fn, solution, ground_truth, extra_info, timeout_s)``."""


def run_scoring_chunk(jobs: list[ScoringJob]) -> list[ScoringOutcome]:
    """:func:`run_scoring` on each job in turn (one round trip for many samples), each
    under its own alarm."""
    return [run_scoring(*job) for job in jobs]
