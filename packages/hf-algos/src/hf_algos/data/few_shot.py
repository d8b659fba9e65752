"""Few-shot prompts for base models: ``k`` solved examples, then the question.

The examples are rows of a source (``data.few_shot_files``, else the training rows),
chosen with a seed; each example's answer is its ``reward_model.ground_truth``. One more
row than ``k`` is chosen, a spare: a prompt whose own question is among the examples gets
the spare in its place, so no prompt is its own example. Drawn from the training rows, the
chosen rows are set aside (:attr:`FewShotExamples.rows`): they are never training prompts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hf_algos.data.files import DataError
from hf_algos.data.sources import TablePart, row_count

DEFAULT_TEMPLATE = "Q: {question}\nA: {answer}"
"""One solved example (``data.few_shot_template``'s default)."""


@dataclass(frozen=True)
class FewShotExample:
    """One solved example."""

    question: str
    """The example's prompt as text (its non-system messages' contents)."""
    answer: str
    """Its answer (the row's ``reward_model.ground_truth``)."""


@dataclass(frozen=True)
class FewShotExamples:
    """The examples every prompt of a run is shown (it must pickle: tokenizing workers
    get it)."""

    examples: tuple[FewShotExample, ...]
    """``k`` examples and, when the source had a row to spare, one spare, in drawn order."""
    k: int
    """Examples per prompt."""
    template: str = DEFAULT_TEMPLATE
    """One example, with ``{question}`` and ``{answer}``."""
    source: tuple[str, ...] = ()
    """The files / specs the examples came from."""
    rows: tuple[tuple[int, int], ...] = ()
    """``(file number, row)`` of each example in :attr:`source`."""

    def render(self, question: str, header: str | None = None) -> str:
        """The prompt of ``question``: ``header`` (a system text) when given, the first
        ``k`` examples whose question differs from ``question``, then ``question`` with an
        empty answer, blocks separated by a blank line, no trailing whitespace."""
        chosen = [e for e in self.examples if e.question != question][: self.k]
        blocks = [header] if header else []
        blocks += [self.template.format(question=e.question, answer=e.answer) for e in chosen]
        blocks.append(self.template.format(question=question, answer="").rstrip())
        return "\n\n".join(blocks)


def question_text(prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """A prompt's question: a string as is, else its non-system messages' contents joined
    by newlines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m["content"]) for m in prompt if m.get("role") != "system")


def system_text(prompt: str | Sequence[Mapping[str, Any]], default: str | None) -> str | None:
    """A prompt's own leading system message, else ``default``."""
    if not isinstance(prompt, str) and prompt and prompt[0].get("role") == "system":
        return str(prompt[0]["content"])
    return default


def draw_examples(
    parts: Sequence[TablePart],
    k: int,
    seed: int,
    prompt_key: str = "prompt",
    template: str = DEFAULT_TEMPLATE,
    keep_prompts: bool = False,
) -> FewShotExamples:
    """``k`` examples and a spare drawn (seeded) from the rows of ``parts``, with distinct
    questions (too few distinct ones raise :class:`DataError`).

    ``keep_prompts``: the rows are the training prompts too, so at least one must be left
    over. A source with too few rows, or an example row without a prompt or a
    ``reward_model.ground_truth``, raises :class:`DataError` naming it and the fix.
    """
    total = row_count(parts)
    least = k + 1 if keep_prompts else k
    if total < least:
        where = ", ".join(str(p.file) for p in parts)
        raise DataError(
            where,
            None,
            f"has {total} rows, too few for data.few_shot={k} examples"
            + (" and a training prompt" if keep_prompts else ""),
            "lower data.few_shot or give more rows (data.few_shot_files)",
        )
    size = min(k + 1, total - 1 if keep_prompts else total)
    starts = np.cumsum([0, *(len(p.rows) for p in parts)])
    examples: list[FewShotExample] = []
    rows: list[tuple[int, int]] = []
    for pick in np.random.default_rng(seed).permutation(total).tolist():
        number = int(np.searchsorted(starts, pick, side="right")) - 1
        row = pick - int(starts[number])
        example = _example(parts[number], row, prompt_key)
        if any(example.question == seen.question for seen in examples):
            continue  # a repeated question teaches nothing new (generated tasks repeat rows)
        examples.append(example)
        rows.append((number, row))
        if len(examples) == size:
            break
    if len(examples) < size:
        raise DataError(
            ", ".join(str(p.file) for p in parts),
            None,
            f"has {len(examples)} distinct questions, too few for data.few_shot={k} examples "
            "and a spare",
            "lower data.few_shot or give more rows (data.few_shot_files)",
        )
    source = tuple(str(p.file) for p in parts)
    return FewShotExamples(tuple(examples), k, template, source, tuple(rows))


def _example(part: TablePart, row: int, prompt_key: str) -> FewShotExample:
    """Row ``row`` of ``part`` as an example; raises :class:`DataError` naming what it lacks."""
    values = dict(part.rows[row])
    prompt = values.get(prompt_key)
    reward = values.get("reward_model")
    answer = reward.get("ground_truth") if isinstance(reward, Mapping) else None
    if prompt is None or answer is None:
        field = prompt_key if prompt is None else "reward_model.ground_truth"
        raise DataError(
            part.source(row),
            field,
            "is missing, and this row was drawn as a few-shot example",
            "give every row of the few-shot source (data.few_shot_files, else "
            "data.train_files) a prompt and a reward_model.ground_truth",
        )
    return FewShotExample(question_text(prompt), str(answer))
