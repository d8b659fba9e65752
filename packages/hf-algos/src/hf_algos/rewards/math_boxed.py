"""Math answers in ``\\boxed{...}``: extraction with brace matching and light normalization."""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed_content(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``) in ``text``.

    Braces are matched, so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``. ``None`` when
    there is no box or its braces never close.
    """
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start:]
    command = next(c for c in _BOX_COMMANDS if rest.startswith(c))
    rest = rest[len(command) :]
    if rest.startswith(" "):  # "\boxed 5": the token up to the next space or "$"
        return re.split(r"[\s$]", rest.lstrip(), maxsplit=1)[0] or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for index, char in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return rest[1:index]
    return None


_REMOVALS = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "$", "^\\circ", "^{\\circ}", "\\%")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_SIMPLE_FRAC = re.compile(r"\\frac(\d)(\d)")


def normalize_math_answer(answer: str) -> str:
    """A canonical form for comparing answers: spacing, ``\\left``/``\\right``, ``\\dfrac``,
    ``\\text{}`` wrappers, units of degrees and percent, a leading ``x =`` and trailing dots
    do not matter."""
    text = answer.strip()
    text = _TEXT.sub(r"\1", text)
    for removal in _REMOVALS:
        text = text.replace(removal, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _SIMPLE_FRAC.sub(r"\\frac{\1}{\2}", text)
    text = re.sub(r"^[a-zA-Z]\s*=", "", text)
    text = text.replace(" ", "").rstrip(".")
    if text.startswith("."):
        text = "0" + text
    return text


def _as_number(text: str) -> Fraction | None:
    match = re.fullmatch(r"\\frac\{(-?\d+)\}\{(-?\d+)\}", text)
    try:
        if match:
            return Fraction(int(match[1]), int(match[2]))
        if re.fullmatch(r"-?\d+/\d+|-?\d+(?:\.\d+)?", text.replace(",", "")):
            return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None
    return None


def math_answers_equal(answer: str, ground_truth: str) -> bool:
    """Whether two answers agree after :func:`normalize_math_answer`, or as equal numbers."""
    left, right = normalize_math_answer(answer), normalize_math_answer(ground_truth)
    if left == right:
        return True
    left_number, right_number = _as_number(left), _as_number(right)
    return left_number is not None and left_number == right_number


def compute_math_score(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """1.0 if the last ``\\boxed{}`` answer of ``solution`` equals ``ground_truth``, else 0.0.

    ``ground_truth`` may itself contain a ``\\boxed{}`` (a reference solution).
    """
    answer = last_boxed_content(solution)
    if answer is None:
        return 0.0
    truth = str(ground_truth)
    truth = last_boxed_content(truth) or truth
    return 1.0 if math_answers_equal(answer, truth) else 0.0
