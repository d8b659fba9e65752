"""Several scoring functions with weights, as TRL's ``reward_funcs`` + ``reward_weights``.

A sample's score is the weighted sum of the functions' scores. As in TRL, a function may
return ``None`` for a sample it does not apply to: it is then left out of that sample's sum
(TRL's ``nansum``). A sample that every function gives ``None`` fails with a named error
(never a silent 0) and counts against ``reward.max_error_fraction`` like a function that
raised. Each function keeps its own call form (verl per-sample, TRL batched), is called
once per sample (a batched one once per chunk of samples) in the same scoring process, and
its unweighted score is reported under its name: ``reward_extra_info[name]`` per sample and
the metric ``reward/<name>/mean`` over the samples it scored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hf_algos.rewards.outcome import ScoringOutcome
from hf_algos.rewards.signature import ScoringCall, scoring_call
from hf_algos.rewards.user_file import (
    FileScoringFunction,
    RewardFileError,
    is_batched,
    load_functions,
)

RESERVED_NAMES = frozenset({"score", "status", "error", "errors", "timeouts"})
"""Names a function of a weighted list cannot go by: its per-sample value and metric would
overwrite the total's (``reward/score/mean``) or the failure counts."""

ALL_NONE = "every reward function returned None for this sample"
"""The start of the error of a sample that no function of a weighted list scored."""

_PRECEDENCE = ("fatal", "timeout", "skipped", "error")
"""Failure statuses, the one reported first when a sample's functions fail differently."""


@dataclass(frozen=True)
class WeightedCall:
    """How a :class:`WeightedRewardFunctions` is called: one call per function, with the
    fields its own signature names (see :mod:`hf_algos.rewards.signature`)."""

    calls: tuple[ScoringCall, ...]
    """Each function's call, in the order of ``names``."""
    names: tuple[str, ...]
    """The functions' names: keys of ``reward_extra_info`` and of the metrics."""
    weights: tuple[float, ...]
    """Each function's weight in the sum."""

    @property
    def name(self) -> str:
        """The functions' names with their weights, for messages."""
        parts = ", ".join(f"{n} x {w:g}" for n, w in zip(self.names, self.weights, strict=True))
        return f"weighted sum [{parts}]"

    def needs(self, field_name: str) -> bool:
        """Whether a call of any of the functions passes ``field_name``."""
        return any(call.needs(field_name) for call in self.calls)

    @property
    def columns(self) -> tuple[str, ...]:
        """The dataset columns the functions' parameters name (each row must have them)."""
        return tuple(dict.fromkeys(c for call in self.calls for c in call.columns))


AnyScoringCall = ScoringCall | WeightedCall
"""What the manager sends a scoring process: one function's call or a weighted list's."""


def calls_per_sample(call: AnyScoringCall) -> int:
    """How many function calls score one sample (each may take up to ``timeout_s``)."""
    return len(call.calls) if isinstance(call, WeightedCall) else 1


class WeightedRewardFunctions:
    """Scoring functions and their weights, scored as one (see the module docstring).

    ``functions`` are any scoring functions (:data:`~hf_algos.rewards.registry.ScoreFn`,
    e.g. :class:`~hf_algos.rewards.user_file.FileScoringFunction`); ``weights`` default to
    1.0 each; ``names`` default to the functions' ``name`` or ``__name__``. Bad lengths,
    repeated or reserved names and non-finite weights raise
    :class:`~hf_controller.ConfigurationError` naming the fix.
    """

    def __init__(
        self,
        functions: Sequence[Callable[..., Any]],
        weights: Sequence[float] | None = None,
        names: Sequence[str] | None = None,
    ) -> None:
        self.functions = tuple(functions)
        self.names = tuple(names) if names is not None else tuple(map(_name_of, functions))
        self.weights = tuple(float(w) for w in weights) if weights is not None else None
        _check(self.names, self.weights)

    @classmethod
    def from_file(
        cls, path: str, names: Sequence[str], weights: Sequence[float] | None = None
    ) -> WeightedRewardFunctions:
        """The functions ``names`` of the Python file at ``path`` (``reward.function_path``);
        every name the file lacks is reported in one :class:`RewardFileError`."""
        _check(tuple(names), None if weights is None else tuple(map(float, weights)))
        load_functions(path, names)
        return cls([FileScoringFunction(path, name) for name in names], weights, names)

    @property
    def resolved_weights(self) -> tuple[float, ...]:
        """The weights in force (1.0 each when none were given)."""
        return self.weights if self.weights is not None else (1.0,) * len(self.functions)

    def scoring_call(self) -> WeightedCall:
        """How the functions are called; a function whose parameters name no field raises
        :class:`~hf_algos.rewards.signature.ScoringSignatureError` naming it."""
        calls = tuple(scoring_call(fn, batched=is_batched(fn)) for fn in self.functions)
        return WeightedCall(calls=calls, names=self.names, weights=self.resolved_weights)

    def __repr__(self) -> str:
        return f"WeightedRewardFunctions({list(self.names)!r}, weights={self.weights!r})"


def combine_outcomes(
    call: WeightedCall, per_function: Sequence[Sequence[ScoringOutcome]]
) -> list[ScoringOutcome]:
    """One outcome per sample from each function's outcomes (``per_function[f][i]``: function
    ``f`` on sample ``i``; ``nan`` score: it returned ``None``)."""
    count = len(per_function[0]) if per_function else 0
    return [_combine(call, [outs[i] for outs in per_function]) for i in range(count)]


def _combine(call: WeightedCall, outcomes: list[ScoringOutcome]) -> ScoringOutcome:
    """The weighted sum of one sample's function outcomes, or its first failure."""
    failed = [(n, o) for n, o in zip(call.names, outcomes, strict=True) if o.status != "ok"]
    if failed:
        failed.sort(key=lambda pair: _PRECEDENCE.index(pair[1].status))
        error = "; ".join(f"{name}: {o.error}" for name, o in failed)
        return ScoringOutcome(status=failed[0][1].status, error=error)
    total = 0.0
    extras: dict[str, float] = {}
    for name, weight, outcome in zip(call.names, call.weights, outcomes, strict=True):
        if math.isnan(outcome.score):  # None: the function does not apply to this sample
            continue
        total += weight * outcome.score
        extras[name] = outcome.score
        extras.update({f"{name}/{key}": value for key, value in outcome.extras.items()})
    if not extras:
        return ScoringOutcome(
            status="error",
            error=f"{ALL_NONE} ({', '.join(call.names)}); a function may return None where it "
            f"does not apply, but at least one must score each sample: return 0.0 from one "
            f"of them where none applies",
        )
    return ScoringOutcome(score=total, extras=extras)


def _name_of(fn: Callable[..., Any]) -> str:
    """The name a function goes by in metrics: its ``name`` (a file's function) or
    ``__name__``."""
    if isinstance(fn, FileScoringFunction):
        return fn.name
    inner = getattr(fn, "func", fn)  # a functools.partial shows its function
    return str(getattr(inner, "__name__", None) or repr(fn))


def _check(names: tuple[str, ...], weights: tuple[float, ...] | None) -> None:
    """Refuse an empty list, repeated or reserved names, bad weights (naming the fix)."""
    if not names:
        raise RewardFileError(
            "reward.function_name is an empty list; name at least one scoring function"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise RewardFileError(
            f"reward.function_name lists {repeated} more than once; name each function once "
            f"and give it the sum of its weights in reward.function_weights"
        )
    reserved = sorted(set(names) & RESERVED_NAMES)
    if reserved:
        raise RewardFileError(
            f"reward.function_name lists {reserved}, which would hide the total's "
            f"reward_extra_info / metric (reward/score/mean) of the same name; rename the "
            f"function in the file (or wrap it: def my_score(**kw): return score(**kw))"
        )
    if weights is None:
        return
    if len(weights) != len(names):
        raise RewardFileError(
            f"reward.function_weights has {len(weights)} weight(s) {list(weights)} but "
            f"reward.function_name names {len(names)} function(s) {list(names)}; give one "
            f"weight per function, in the same order (or null: 1.0 each)"
        )
    bad = [w for w in weights if not math.isfinite(w)]
    if bad:
        raise RewardFileError(f"reward.function_weights={list(weights)} holds {bad}; give numbers")
