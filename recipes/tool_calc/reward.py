"""The tool_calc reward: 1 for the exact product as the final answer, else 0.

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
    """1.0 when the final answer (:func:`final_answer`) is the product, else 0.0."""
    return 1.0 if final_answer(solution) == str(ground_truth).strip() else 0.0
