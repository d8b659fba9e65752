"""The quickstart's second task: deal six letters into two piles, ``abcdef=`` -> ``acebdf``.

The answer is the letters at odd positions (1st, 3rd, 5th) followed by those at even
positions (2nd, 4th, 6th), the way cards are dealt to two players and the piles put
together. Built like :mod:`hf_algos.examples.reverse_letters` (same rows, model, tokenizer
and reward rule, from :mod:`hf_algos.examples.letter_tasks`), so the quickstart's settings
can be checked on a task they were not tuned on: ``python -m recipes.quickstart.main
task.name=deal_letters``. Like reversing it only moves letters, but by a different,
non-monotone permutation (each answer position reads a different offset back into the
prompt), so a policy that learnt to reverse could not answer it.

Why this task and not sorting (:mod:`hf_algos.examples.sort_letters`): the quickstart's
0.53M-parameter model gets sorting wrong only on words with repeated letters (it has to
count them), and even supervised training on the right answers only creeps from 0.73 to
0.77 held-out accuracy over 160 more steps of the warm-up's kind; 300 GRPO steps cannot be
expected to do better. docs/benchmarks.md, "Quickstart over seeds", has the measurements.
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
    "DEAL_LETTERS",
    "DEAL_LETTERS_SOURCE",
    "compute_deal_letters_score",
    "make_deal_letters_rows",
    "register_reward",
    "write_task_files",
]

DEAL_LETTERS_SOURCE = "deal_letters"
"""The ``data_source`` of the task's rows (the name its scoring function is registered as)."""


def compute_deal_letters_score(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """1.0 for the exact answer, -0.5 for one of the wrong length, else 0.5 x the fraction
    of right characters (:func:`hf_algos.examples.letter_tasks.score_letters`)."""
    return score_letters(solution, str(ground_truth))


def _deal(word: str) -> str:
    return word[0::2] + word[1::2]


DEAL_LETTERS = LetterTask(DEAL_LETTERS_SOURCE, _deal, compute_deal_letters_score)
"""The task: ``abcdef=`` -> ``acebdf`` (odd positions, then even positions)."""


def make_deal_letters_rows(n: int, length: int = 6, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows ``{"prompt": "abcdef=", ..., "reward_model": {"ground_truth": "acebdf"}}``,
    reproducible from ``seed`` (the row format of :func:`make_letter_rows`)."""
    return make_letter_rows(DEAL_LETTERS, n, length, seed)


def register_reward() -> None:
    """Register :func:`compute_deal_letters_score` for ``data_source`` ``deal_letters``
    (a second call does nothing)."""
    register_letter_task(DEAL_LETTERS)


def write_task_files(directory: Path, task: TaskConfig) -> dict[str, Path]:
    """Write the deal-letters task's ``train.jsonl``, ``val.jsonl`` and ``sft.jsonl``."""
    return write_letter_task_files(directory, task, DEAL_LETTERS)
