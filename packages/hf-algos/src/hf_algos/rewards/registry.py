"""The explicit registry of rule-based scoring functions, keyed by ``data_source``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hf_algos.rewards.gsm8k import compute_gsm8k_score
from hf_algos.rewards.math_boxed import compute_math_score
from hf_algos.rewards.reasoning_gym import REASONING_GYM_DATA_SOURCE, compute_reasoning_gym_score
from hf_algos.rewards.signature import scoring_call
from hf_algos.rewards.user_file import FileScoringFunction, is_batched
from hf_algos.rewards.weighted import AnyScoringCall, WeightedRewardFunctions

ScoreResult = float | Mapping[str, Any]
"""A score, or a dict with a ``"score"`` entry plus extra numbers reported as metrics."""

ScoreFn = Callable[..., Any]
"""A scoring function, called by KEYWORD with the fields its parameters name (see
:mod:`hf_algos.rewards.signature`): verl's ``compute_score(data_source, solution_str,
ground_truth, extra_info=None)``, HybridFlow's ``score(solution, ground_truth,
extra_info=None)`` (both ``-> score or {"score": ..., **extras}``), or a batched TRL-style
``fn(completions, **kwargs) -> list[float]`` registered with ``batched=True``.

It runs in a worker process: a module-level function, a ``functools.partial`` of one, or a
function of a script / notebook (``__main__``, sent by value with cloudpickle).
"""


@dataclass(frozen=True)
class BatchedScoringFunction:
    """A registry entry for a batched (TRL-style) function: one call scores many samples."""

    fn: Callable[..., Any]
    """``fn(completions, **kwargs) -> list[float]``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function."""
        return self.fn(*args, **kwargs)


RewardEntry = ScoreFn | WeightedRewardFunctions
"""What scores a data_source: one scoring function, or a weighted list of them
(``reward.function_name`` naming several, see :mod:`hf_algos.rewards.weighted`)."""

SCORING_FUNCTIONS: dict[str, ScoreFn] = {}
"""``data_source`` -> scoring function. Add entries with :func:`register_scoring_function`."""


def register_scoring_function(
    data_source: str,
    fn: ScoreFn,
    registry: dict[str, ScoreFn] | None = None,
    batched: bool | None = None,
) -> None:
    """Add ``fn`` under ``data_source``; a name already taken raises.

    ``fn``'s signature is checked here: a function whose parameters do not name the fields
    they want raises ``TypeError`` listing the accepted forms. ``batched=True`` registers a
    TRL-style ``fn(completions, **kwargs) -> list[float]``; ``None`` (the default) decides
    by :func:`~hf_algos.rewards.user_file.is_batched` (a ``batched`` attribute on ``fn``,
    else whether it takes ``completions``).
    """
    if batched is None:
        batched = is_batched(fn)
    target = SCORING_FUNCTIONS if registry is None else registry
    if data_source in target:
        raise ValueError(
            f"a scoring function for data_source {data_source!r} is already registered "
            f"({target[data_source]!r}); pick another name or pass your own registry"
        )
    scoring_call(fn, batched=batched)  # refuses a function that cannot be called by keyword
    target[data_source] = BatchedScoringFunction(fn) if batched else fn


def get_scoring_function(
    data_source: str, registry: Mapping[str, ScoreFn] | None = None
) -> ScoreFn:
    """The scoring function of ``data_source``; an unknown name raises, listing the known ones."""
    source = SCORING_FUNCTIONS if registry is None else registry
    if data_source not in source:
        raise KeyError(
            f"no scoring function for data_source {data_source!r}; registered: "
            f"{sorted(source)}. Register one with register_scoring_function()."
        )
    return source[data_source]


def resolve_scoring_function(
    data_source: str,
    registry: Mapping[str, ScoreFn] | None = None,
    default: RewardEntry | None = None,
) -> RewardEntry:
    """The function that scores rows of ``data_source``.

    Precedence: a function registered for ``data_source`` by the user's code, then
    ``default`` (``reward.function_path``: it serves every other data_source, and replaces
    the built-in gsm8k / math / reasoning_gym functions, as verl's custom reward function
    replaces its default scoring), then a built-in one. Without ``default`` an unknown name raises.
    """
    source = SCORING_FUNCTIONS if registry is None else registry
    if default is None:
        return get_scoring_function(data_source, source)
    entry = source.get(data_source)
    if entry is None or BUILTIN_SCORING_FUNCTIONS.get(data_source) is entry:
        return default
    return entry


def scoring_call_of(entry: RewardEntry) -> AnyScoringCall:
    """How a registry entry is called (a :class:`BatchedScoringFunction` is batched; a
    :class:`~hf_algos.rewards.user_file.FileScoringFunction` as its function says; a
    :class:`~hf_algos.rewards.weighted.WeightedRewardFunctions` each function as its own)."""
    if isinstance(entry, WeightedRewardFunctions):
        return entry.scoring_call()
    if isinstance(entry, BatchedScoringFunction):
        return scoring_call(entry.fn, batched=True)
    if isinstance(entry, FileScoringFunction):
        return scoring_call(entry, batched=entry.batched)
    return scoring_call(entry)


BUILTIN_SCORING_FUNCTIONS: Mapping[str, ScoreFn] = {
    "openai/gsm8k": compute_gsm8k_score,
    "gsm8k": compute_gsm8k_score,
    "math": compute_math_score,
    "lighteval/MATH": compute_math_score,
    "DigitalLearningGmbH/MATH-lighteval": compute_math_score,
    REASONING_GYM_DATA_SOURCE: compute_reasoning_gym_score,
}
"""The functions HybridFlow registers itself; ``reward.function_path`` takes precedence."""

for _name, _fn in BUILTIN_SCORING_FUNCTIONS.items():
    register_scoring_function(_name, _fn)
