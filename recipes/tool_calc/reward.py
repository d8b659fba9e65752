"""The tool_calc reward: 1 for the exact product as the final answer, partial credit for a
final answer of the right length (0.5 x the share of digits in the right place), else 0.

The partial credit gives GRPO a gradient before the policy answers exactly: with an exact
match only, a warm-up that left held-out accuracy near 0.1 gave groups of all-zero rewards
and the policy drifted to 0 (measured). Both arms use this same reward.

Loaded by path by the reward manager (``reward.function_path``), so it imports nothing but
the standard library. It takes the text after the response's last tag as the final answer,
so it scores the same whether the reward sees the environment's tokens or only the model's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_UP_TO_LAST_TAG = re.compile(r".*>", re.DOTALL)


def final_answer(solution: str) -> str:
    """The model's final answer in a response: the text after its last tag, stripped.

    ``"<calc>12*3</calc><result>36</result>36"`` and ``"<calc>12*3</calc>36"`` (the response
    with or without the environment's tokens) both give ``"36"``; ``"36"`` gives ``"36"``.
    """
    return _UP_TO_LAST_TAG.sub("", solution, count=1).strip()


def compute_score(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """1.0 when the final answer (:func:`final_answer`) is the product; for an answer of the
    product's length, 0.5 x the share of its digits in the right place; else 0.0."""
    answer, expected = final_answer(solution), str(ground_truth).strip()
    if answer == expected:
        return 1.0
    if len(answer) != len(expected):
        return 0.0
    return 0.5 * sum(a == b for a, b in zip(answer, expected, strict=True)) / len(expected)
