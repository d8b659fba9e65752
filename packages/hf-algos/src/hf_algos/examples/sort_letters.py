"""A second generated task for the quickstart: sort six random letters, ``dbfaec=`` -> ``abcdef``.

Built like :mod:`hf_algos.examples.reverse_letters` (same rows, model, tokenizer and reward
rule, from :mod:`hf_algos.examples.letter_tasks`), so the quickstart's settings can be
checked on a task they were not tuned on: ``python -m recipes.quickstart.main
task.name=sort_letters``. Reversing only moves letters by position; sorting has to compare
them, so the answer at each position depends on every letter of the prompt. Measured: the
quickstart's settings do not teach it (the warm-up already reaches ~0.7 and GRPO drifts
down). Not for want of exploration: the quickstart's 2-layer model fails on words with a
repeated letter (it has to count copies), and supervised training on the right answers
climbs just as slowly, so the quickstart's second task is
:mod:`hf_algos.examples.deal_letters` (docs/benchmarks.md, "Quickstart over seeds").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hf_algos.examples.letter_tasks import (
    LetterTask,
    TaskConfig,
    make_letter_rows,
    register_letter_task,
    score_letters,
    write_letter_task_files,
)

__all__ = [
    "SORT_LETTERS",
    "SORT_LETTERS_SOURCE",
    "compute_sort_letters_score",
    "make_sort_letters_rows",
    "register_reward",
    "write_task_files",
]

SORT_LETTERS_SOURCE = "sort_letters"
"""The ``data_source`` of the task's rows (the name its scoring function is registered as)."""


def compute_sort_letters_score(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """1.0 for the exact answer, -0.5 for one of the wrong length, else 0.5 x the fraction
    of right characters (:func:`hf_algos.examples.letter_tasks.score_letters`)."""
    return score_letters(solution, str(ground_truth))


def _sorted(word: str) -> str:
    return "".join(sorted(word))


SORT_LETTERS = LetterTask(SORT_LETTERS_SOURCE, _sorted, compute_sort_letters_score)
"""The task: ``dbfaec=`` -> ``abcdef`` (repeated letters kept)."""


def make_sort_letters_rows(n: int, length: int = 6, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows ``{"prompt": "dbfaec=", ..., "reward_model": {"ground_truth": "abcdef"}}``,
    reproducible from ``seed`` (the row format of :func:`make_letter_rows`)."""
    return make_letter_rows(SORT_LETTERS, n, length, seed)


def register_reward() -> None:
    """Register :func:`compute_sort_letters_score` for ``data_source`` ``sort_letters``
    (a second call does nothing)."""
    register_letter_task(SORT_LETTERS)


def write_task_files(directory: Path, task: TaskConfig) -> dict[str, Path]:
    """Write the sort-letters task's ``train.jsonl``, ``val.jsonl`` and ``sft.jsonl``."""
    return write_letter_task_files(directory, task, SORT_LETTERS)
