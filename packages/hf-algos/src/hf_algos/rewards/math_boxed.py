"""Math answers in ``\\boxed{...}``: extraction with brace matching, comparison by math-verify.

``math_verify`` (with sympy) is imported on the first comparison, in the scoring process."""

from __future__ import annotations

import re
from collections.abc import Mapping
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


def math_answers_equal(answer: str, ground_truth: str) -> bool:
    """Whether ``answer`` agrees with ``ground_truth``: equal after
    :func:`normalize_math_answer`, or equal as math by ``math_verify`` (``\\frac{1}{2}`` and
    ``0.5``, ``\\sqrt{4}`` and ``2``, ``x+1`` and ``1+x``, intervals, sets, percent...)."""
    if normalize_math_answer(answer) == normalize_math_answer(ground_truth):
        return True
    return _math_verify_equal(ground_truth, answer)


def _math_verify_equal(gold: str, answer: str) -> bool:
    import math_verify
    from math_verify import grader, parser

    # No timeouts of math_verify's own: they use SIGALRM, which works in the main thread
    # only and would replace the scoring worker's alarm that bounds each sample's time.
    # So its warning that timeouts are off says nothing here.
    parser.TIMEOUT_WARNING_SHOWN = grader.TIMEOUT_WARNING_SHOWN = True
    parsed_gold = math_verify.parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
    parsed_answer = math_verify.parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
    if not parsed_gold or not parsed_answer:
        return False
    return bool(math_verify.verify(parsed_gold, parsed_answer, timeout_seconds=None))


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
