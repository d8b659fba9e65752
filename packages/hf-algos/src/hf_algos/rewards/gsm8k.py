"""GSM8K: the answer is the number after ``####`` (strict) or the last number (flexible),
compared with the ground truth by math-verify."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hf_algos.rewards.math_boxed import math_answers_equal

_STRICT = re.compile(r"####\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")


def extract_gsm8k_answer(text: str, strict: bool = True) -> str | None:
    """The final answer of ``text`` with commas removed, or ``None`` when there is none.

    Strict: the last ``#### <number>``. Flexible: the last number anywhere in the text.
    """
    matches = _STRICT.findall(text) if strict else _NUMBER.findall(text)
    if not matches:
        return None
    return _normalize_number(matches[-1])


def _normalize_number(text: str) -> str:
    text = text.replace(",", "").strip()
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text or "0"


def compute_gsm8k_score(
    solution: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    strict: bool = True,
    format_score: float = 0.0,
) -> float:
    """1.0 if the extracted answer equals ``ground_truth``; ``format_score`` if an answer was
    found but is wrong; 0.0 if none was found.

    ``ground_truth`` may be a number or a string such as ``"1,234"``, ``"$18"``, ``"1/2"`` or
    a full GSM8K solution ending in ``#### 1234``; equal numbers in other forms agree
    (``0.5`` and ``1/2``), by :func:`~hf_algos.rewards.math_boxed.math_answers_equal`.
    """
    truth = str(ground_truth)
    expected = extract_gsm8k_answer(truth, strict=True) if "####" in truth else None
    expected = expected or _normalize_number(truth)
    answer = extract_gsm8k_answer(solution, strict=strict)
    if answer is None:
        return 0.0
    return 1.0 if answer == expected or math_answers_equal(answer, expected) else format_score
