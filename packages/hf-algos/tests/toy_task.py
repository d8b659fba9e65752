"""The hf-algos tests' own toy task: sort a few random digits (``"312="`` -> ``"123"``).

The library ships no task; this one gives the data, reward and trainer tests rows with a
``data_source`` and a rule-based score with partial credit (so GRPO advantages are not all
zero). Tests that score it through the global registry, as the trainers do, take the
``toy_task_scored`` fixture of ``conftest.py``, which registers :func:`score_sorted_digits`
with ``register_scoring_function`` and removes it afterwards.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

SORT_DIGITS_SOURCE = "sort_digits"
"""The ``data_source`` of the toy rows (the name their scoring function is registered as)."""


def make_sort_digits_rows(n: int, length: int = 3, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows ``{"prompt": "312=", "reward_model": {"ground_truth": "123"}, ...}``.

    Rows are in the ``hf_algos.data`` format (``data_source`` and ``extra_info`` included)
    and reproducible from ``seed``.
    """
    rng = random.Random(seed)
    words = ["".join(rng.choices("0123456789", k=length)) for _ in range(n)]
    return [
        {
            "prompt": word + "=",
            "data_source": SORT_DIGITS_SOURCE,
            "reward_model": {"ground_truth": "".join(sorted(word))},
            "extra_info": {"index": index},
        }
        for index, word in enumerate(words)
    ]


def score_sorted_digits(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """Share of positions that hold the expected digit, over the longer of the two strings.

    ``"123"`` for ``"123"`` scores 1.0, ``"132"`` 1/3, ``"1234"`` 3/4 and ``""`` 0.0.
    """
    expected, answer = str(ground_truth), solution.strip()
    longest = max(len(expected), len(answer))
    if longest == 0:
        return 1.0
    return sum(map(str.__eq__, expected, answer)) / longest
