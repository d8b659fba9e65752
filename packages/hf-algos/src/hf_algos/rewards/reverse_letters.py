"""Score of the quickstart task: reverse the letters of the prompt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def compute_reverse_letters_score(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """1.0 for the exact answer, else 0.5 x the fraction of right characters.

    The answer is ``solution`` with surrounding whitespace removed. Characters are compared
    position by position over the expected length, so a partly right answer earns partial
    credit that a small model can climb; extra characters only cost the exact-match bonus.
    """
    expected = str(ground_truth)
    answer = solution.strip()
    if answer == expected:
        return 1.0
    if not expected:
        return 0.0
    right = sum(1 for got, want in zip(answer, expected, strict=False) if got == want)
    return 0.5 * right / len(expected)
