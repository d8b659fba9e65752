"""The explicit registry of rule-based scoring functions, keyed by ``data_source``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hf_algos.rewards.gsm8k import compute_gsm8k_score
from hf_algos.rewards.math_boxed import compute_math_score

ScoreResult = float | Mapping[str, Any]
"""A score, or a dict with a ``"score"`` entry plus extra numbers reported as metrics."""

ScoreFn = Callable[[str, Any, Mapping[str, Any] | None], ScoreResult]
"""``score_fn(solution_text, ground_truth, extra_info) -> score or {"score": ..., ...}``.

It runs in a worker process, so it must be picklable: a module-level function (or a
``functools.partial`` of one).
"""

SCORING_FUNCTIONS: dict[str, ScoreFn] = {}
"""``data_source`` -> scoring function. Add entries with :func:`register_scoring_function`."""


def register_scoring_function(
    data_source: str, fn: ScoreFn, registry: dict[str, ScoreFn] | None = None
) -> None:
    """Add ``fn`` under ``data_source``; a name already taken raises."""
    target = SCORING_FUNCTIONS if registry is None else registry
    if data_source in target:
        raise ValueError(
            f"a scoring function for data_source {data_source!r} is already registered "
            f"({target[data_source]!r}); pick another name or pass your own registry"
        )
    target[data_source] = fn


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


for _name, _fn in (
    ("openai/gsm8k", compute_gsm8k_score),
    ("gsm8k", compute_gsm8k_score),
    ("math", compute_math_score),
    ("lighteval/MATH", compute_math_score),
    ("DigitalLearningGmbH/MATH-lighteval", compute_math_score),
):
    register_scoring_function(_name, _fn)
