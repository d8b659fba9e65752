"""The generated letter tasks by name, as the quickstart's ``task.name`` selects them."""

from __future__ import annotations

from hf_algos.examples.deal_letters import DEAL_LETTERS
from hf_algos.examples.letter_tasks import LetterTask
from hf_algos.examples.reverse_letters import REVERSE_LETTERS
from hf_algos.examples.sort_letters import SORT_LETTERS

__all__ = ["LETTER_TASKS", "letter_task"]

LETTER_TASKS: dict[str, LetterTask] = {
    REVERSE_LETTERS.data_source: REVERSE_LETTERS,
    DEAL_LETTERS.data_source: DEAL_LETTERS,
    SORT_LETTERS.data_source: SORT_LETTERS,
}
"""Task name (its ``data_source``) -> task."""


def letter_task(name: str) -> LetterTask:
    """The task called ``name``; raises ``ValueError`` listing the known names."""
    try:
        return LETTER_TASKS[name]
    except KeyError:
        raise ValueError(
            f"unknown task.name {name!r}; choose one of {sorted(LETTER_TASKS)}"
        ) from None
