"""The reward's circuit breaker and set-up verdict: a function that cannot work stops the run
at once, with one message, instead of scoring every sample 0 after its full timeout."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hf_algos.rewards.outcome import ScoringOutcome
from hf_algos.rewards.pool import RewardError
from hf_controller import ConfigurationError

logger = logging.getLogger(__name__)

_PROBE_ANSWER = "The answer is 42."
"""The set-up check's non-empty response where the row has no ground truth to write out."""


class RewardSetupError(ConfigurationError, RewardError):
    """The reward set-up check found a function that cannot score: it failed or timed out on
    every probe sample, or cannot be loaded or called. A user error: the ``hybridflow``
    command prints it as one line and exits 2, before any step."""


class TimeoutCircuit:
    """Counts, per scoring function, the samples of one batch that time out in a row (in the
    order their chunks finish); at ``limit`` it raises :class:`RewardError` (0: never)."""

    def __init__(self, limit: int, timeout_s: float, rows: int) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self.rows = rows
        self._streaks: dict[str, int] = {}

    def record(self, name: str, data_source: str, outcomes: Sequence[ScoringOutcome]) -> None:
        """Count ``outcomes`` (one finished chunk of ``name``'s samples); raise when
        ``limit`` of them have timed out in a row."""
        if not self.limit:
            return
        streak = self._streaks.get(name, 0)
        for outcome in outcomes:
            if outcome.status == "skipped":  # the scoring process already stopped the chunk
                continue
            streak = streak + 1 if outcome.status == "timeout" else 0
            if streak >= self.limit:
                raise RewardError(
                    f"{streak} samples in a row timed out scoring data_source {data_source!r} "
                    f"with {name} (reward.timeout_s={self.timeout_s:g} s each), so the batch "
                    f"stops now instead of waiting up to {self.rows} x {self.timeout_s:g} s; "
                    f"the function hangs: fix it, raise reward.timeout_s, or set "
                    f"reward.max_consecutive_timeouts (now {self.limit}; 0 never stops)"
                )
        self._streaks[name] = streak


def probe_answer(sample: Mapping[str, Any]) -> str:
    """The set-up check's non-empty response: the row's ground truth written out (its first
    accepted answer), else a plain sentence."""
    truth = sample.get("ground_truth")
    if isinstance(truth, list) and truth:
        truth = truth[0]
    if isinstance(truth, str | int | float) and not isinstance(truth, bool) and str(truth):
        return str(truth)
    return _PROBE_ANSWER


def judge_probes(
    name: str, samples: Sequence[Mapping[str, Any]], outcomes: Sequence[ScoringOutcome]
) -> None:
    """The set-up check's verdict on its probe samples (one row, each with another
    response): every one failed or timed out raises :class:`RewardSetupError` naming the
    function and what each probe gave; some failed logs a warning (an empty response may
    fairly make a parser raise)."""
    failed = [(s, o) for s, o in zip(samples, outcomes, strict=True) if o.status != "ok"]
    if not failed:
        return
    source = samples[0]["data_source"]
    what = "; ".join(
        f"on the response {str(s['solution'])[:40]!r}: {o.status} ({_last_line(o.error)})"
        for s, o in failed
    )
    if len(failed) < len(samples):
        logger.warning(
            "reward set-up check: %s (data_source %r) failed on %d of %d probe responses, "
            "%s; the run goes on (a failed sample scores 0 and is counted in reward/errors)",
            name,
            source,
            len(failed),
            len(samples),
            what,
        )
        return
    raise RewardSetupError(
        f"reward set-up check: {name} (data_source {source!r}) failed on every probe "
        f"response of the first row, so no step could score: {what}. A scoring function "
        f"must return a finite number (or {{'score': number}}) for any response, within "
        f"reward.timeout_s; fix it and check it by calling it on those responses"
    )


def _last_line(error: str) -> str:
    """The last line of a failure (the exception itself, not its traceback)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no detail"
