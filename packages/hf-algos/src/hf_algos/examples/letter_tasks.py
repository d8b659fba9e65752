"""What the generated letter tasks share: their rows, their reward rule and their data files.

A letter task maps a random lowercase word to an answer word of the same length (reverse
it, sort it, ...). :class:`LetterTask` names the task's ``data_source`` and its answer
function; :func:`make_letter_rows` and :func:`write_letter_task_files` make its data, and
:func:`score_letters` is the reward every such task uses:

* 1.0 for the exact answer;
* :data:`WRONG_LENGTH_SCORE` (-0.5) for an answer of the wrong length. The response cap is
  one token longer than the answer (the letters and ``<eos>``), so a response that never
  emits ``<eos>`` is cut one letter too long and lands here, as does one that stops early;
* otherwise (right length, some letters wrong) partial credit, 0.5 x the fraction of
  positions holding the right letter, which a small model can climb.

Why the penalty: with partial credit alone (extra letters cost nothing) the quickstart's
policy learnt to stop emitting ``<eos>`` and fill the length cap, and held-out exact accuracy
fell from 0.18 to 0.00 for ~250 GRPO steps before recovering.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_algos.data import write_rows
from hf_algos.rewards import SCORING_FUNCTIONS, register_scoring_function

WRONG_LENGTH_SCORE = -0.5
"""Score of an answer whose length differs from the expected answer's (no ``<eos>`` within
the response cap, or an early one): below any right-length answer."""


@dataclass(frozen=True)
class LetterTask:
    """A generated task: ``word=`` -> ``answer(word)``, scored by ``score``."""

    data_source: str
    """The ``data_source`` of the task's rows (its scoring function is registered under it)."""
    answer: Callable[[str], str]
    """The expected answer to a word (same length as the word)."""
    score: Callable[..., float]
    """The task's scoring function ``score(solution, ground_truth, extra_info=None)``; a
    module-level function, so scoring processes can import it by name."""


@dataclass(frozen=True)
class TaskConfig:
    """Which task, and how much of its data to generate."""

    name: str = "reverse_letters"
    """The task: ``reverse_letters`` or ``sort_letters`` (see :mod:`hf_algos.examples.tasks`)."""
    word_length: int = 6
    """Letters per prompt."""
    train_prompts: int = 20_000
    """Distinct training prompts (GRPO and the SFT warm-up draw from them)."""
    sft_rows: int = 5_760
    """Prompt + answer rows for the SFT warm-up (steps x batch size of the warm-up)."""
    val_prompts: int = 256
    """Held-out prompts for greedy exact-match accuracy."""
    seed: int = 0
    """Seed of the data and of the model's random initialisation."""


def random_letters(rng: random.Random, length: int) -> str:
    """``length`` random lowercase letters drawn from ``rng``."""
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(length))


def make_letter_rows(task: LetterTask, n: int, length: int, seed: int) -> list[dict[str, Any]]:
    """``n`` rows of ``task`` in the ``hf_algos.data`` row format, reproducible from ``seed``.

    Each row is ``{"prompt": "abcdef=", "data_source": task.data_source,
    "reward_model": {"ground_truth": task.answer("abcdef")}, "extra_info": {"index": i}}``;
    the prompt is raw text (a chat template, if the tokenizer has one, wraps it).
    """
    if n < 0 or length < 1:
        raise ValueError(f"need n >= 0 and length >= 1, got n={n}, length={length}")
    rng = random.Random(seed)
    words = [random_letters(rng, length) for _ in range(n)]
    return [
        {
            "prompt": f"{letters}=",
            "data_source": task.data_source,
            "reward_model": {"ground_truth": task.answer(letters)},
            "extra_info": {"index": index},
        }
        for index, letters in enumerate(words)
    ]


def score_letters(solution: str, expected: str) -> float:
    """The letter tasks' reward (see the module docstring): 1.0 exact, -0.5 wrong length,
    else 0.5 x the fraction of right positions.

    ``solution`` is the decoded response with special tokens dropped (the reward manager's
    default), compared after removing surrounding whitespace.
    """
    answer = solution.strip()
    if answer == expected:
        return 1.0
    if len(answer) != len(expected):
        return WRONG_LENGTH_SCORE
    right = sum(1 for got, want in zip(answer, expected, strict=True) if got == want)
    return 0.5 * right / len(expected)


def write_letter_task_files(
    directory: Path, task: TaskConfig, letters: LetterTask
) -> dict[str, Path]:
    """Write ``train.jsonl``, ``val.jsonl`` (prompts) and ``sft.jsonl`` (prompt + response).

    Validation prompts are drawn from their own seed and removed from the training set, so
    accuracy is measured on words the policy never trained on.
    """
    directory.mkdir(parents=True, exist_ok=True)
    val = make_letter_rows(letters, task.val_prompts, task.word_length, seed=task.seed + 1)
    held_out = {row["prompt"] for row in val}
    train = [
        row
        for row in make_letter_rows(letters, task.train_prompts, task.word_length, task.seed)
        if row["prompt"] not in held_out
    ]
    sft = [
        {**row, "response": row["reward_model"]["ground_truth"]} for row in train[: task.sft_rows]
    ]
    paths = {name: directory / f"{name}.jsonl" for name in ("train", "val", "sft")}
    for name, rows in (("train", train), ("val", val), ("sft", sft)):
        write_rows(rows, paths[name])
    return paths


def register_letter_task(task: LetterTask) -> None:
    """Register ``task.score`` for rows whose ``data_source`` is ``task.data_source``.

    Call it before a trainer or ``RewardManager`` scores the task's rows; a second call in
    the same process does nothing.
    """
    if SCORING_FUNCTIONS.get(task.data_source) is not task.score:
        register_scoring_function(task.data_source, task.score)
