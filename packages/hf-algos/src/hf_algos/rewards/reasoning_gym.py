"""Rows of reasoning-gym tasks scored by the task's own verifier (``score_answer``).

The rows come from :mod:`hf_algos.data.reasoning_gym` (``data_source="reasoning_gym"``,
which also holds their entry encoding);
their ``extra_info`` names the task, the answer format and the reasoning-gym entry. The
answer is taken out of the response by :func:`extract_answer`, then the task's
``score_answer(answer, entry)`` scores it. Torch-free: this runs in the reward's scoring
processes, and ``reasoning_gym`` is imported only when a row is scored.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from hf_algos.data.reasoning_gym import (
    ANSWER_FORMATS,
    REASONING_GYM_DATA_SOURCE,
    decode_entry,
    import_reasoning_gym,
)

__all__ = [
    "ANSWER_FORMATS",
    "REASONING_GYM_DATA_SOURCE",
    "compute_reasoning_gym_score",
    "extract_answer",
]

_NUMBER = re.compile(r"-?(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+)?")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_PREFIX = re.compile(r"answer:[ \t]*([^\n]*)", re.IGNORECASE)


def extract_answer(text: str, answer_format: str) -> str | None:
    """The answer in response ``text`` under ``answer_format``; ``None`` when there is none.

    - ``last_number``: the last integer, decimal or fraction (``-3``, ``1,000`` -> ``1000``,
      ``2.5``, ``3/4``), what a plain chat model's answer usually ends with;
    - ``last_line``: the last non-empty line, stripped;
    - ``answer_tag``: the content of the last ``<answer>...</answer>``, stripped;
    - ``answer_prefix``: the rest of the line after the last ``Answer:`` (any case), stripped.

    An unknown format raises ``ValueError`` listing :data:`ANSWER_FORMATS`.
    """
    if answer_format == "last_number":
        numbers = _NUMBER.findall(text)
        return re.sub(r"[,\s]", "", numbers[-1]) if numbers else None
    if answer_format == "last_line":
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1] if lines else None
    if answer_format == "answer_tag":
        tags = _ANSWER_TAG.findall(text)
        return (tags[-1].strip() or None) if tags else None
    if answer_format == "answer_prefix":
        found = _ANSWER_PREFIX.findall(text)
        return (found[-1].strip() or None) if found else None
    raise ValueError(f"unknown answer format {answer_format!r}; use one of {ANSWER_FORMATS}")


def compute_reasoning_gym_score(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """The task's own ``score_answer`` of the answer in ``solution`` (0.0 when none is found).

    ``extra_info`` must hold ``task`` (the reasoning-gym task name) and ``entry`` (the
    reasoning-gym entry ``{question, answer, metadata}``, a dict or its JSON), as the rows of
    a ``reasoning_gym:`` spec do; ``answer_format`` (default ``last_number``) and
    ``task_config`` (the task's settings, dict or JSON) are optional. A row without them
    raises ``ValueError`` naming the field. ``ground_truth`` is not read: the entry holds the
    answer, and some tasks accept several.
    """
    info = extra_info or {}
    task = info.get("task")
    if not isinstance(task, str) or not task:
        raise ValueError(_missing("task", task))
    entry = _decoded(info.get("entry"), "entry")
    if not isinstance(entry, dict) or "answer" not in entry:
        raise ValueError(_missing("entry", info.get("entry")))
    answer = extract_answer(solution, str(info.get("answer_format") or "last_number"))
    if answer is None:
        return 0.0  # the model gave no answer in the asked format
    config = _decoded(info.get("task_config") or {}, "task_config")
    score_answer = _score_answer_fn(task, json.dumps(config, sort_keys=True))
    return float(score_answer(answer, entry))


def _missing(name: str, value: Any) -> str:
    return (
        f"a reasoning_gym row's extra_info[{name!r}] is {value!r:.80}: scoring needs the task "
        f"name ('task') and the reasoning-gym entry ('entry', its JSON). Build the rows with "
        f"a 'reasoning_gym:<task>?size=...' spec or hf_algos.data.reasoning_gym."
        f"reasoning_gym_rows(), which fill them in, or give such rows another data_source"
    )


def _decoded(value: Any, name: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return decode_entry(value)
    except json.JSONDecodeError as error:
        raise ValueError(_missing(name, value) + f" (not JSON: {error.msg})") from error


@functools.cache
def _score_answer_fn(task: str, config_json: str) -> Callable[[str, dict[str, Any]], Any]:
    """The task's ``score_answer``, from a dataset built once per process with the row's
    settings (a few tasks' verifiers read them)."""
    dataset = import_reasoning_gym().create_dataset(task, **json.loads(config_json))
    return dataset.score_answer
