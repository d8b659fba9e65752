"""The shape of one fault-injection case, shared by every ``faults_*.py`` module here.

A case injects one fault into a real run (a real Ray cluster, real worker processes,
real files) and measures what the user would see: how long until a named error or until
the run recovered, and what was lost. :mod:`run_faults` collects the ``FAULTS`` list of
every ``faults_*.py`` module beside this one, runs them and prints the table that
``docs/reliability.md`` shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

OUTCOMES = ("named error", "recovered")
"""What a case may end in. Anything else (a hang, a silent 0, a wrong result) fails it."""


@dataclass(frozen=True)
class FaultResult:
    """What one injected fault led to."""

    outcome: str
    """One of :data:`OUTCOMES`."""
    seconds: float
    """From the injection to the named error (or to the recovered run's next good step)."""
    lost: str
    """What was lost: ``"nothing"`` or e.g. ``"steps since the last checkpoint (1)"``."""
    detail: str
    """The first line of the error the user saw, or how the run recovered."""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")


@dataclass(frozen=True)
class FaultCase:
    """One fault: a name for the table and the function that injects it and measures."""

    name: str
    """Short, for the table's first column, e.g. ``"reward process killed"``."""
    run: Callable[[Path], FaultResult]
    """Given an empty scratch directory, inject the fault and return what happened. Raise
    (e.g. ``AssertionError``) when the system did not name the error or did not recover."""


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """``with stopwatch() as elapsed: ...; elapsed()`` gives seconds since entering."""
    start = time.monotonic()
    yield lambda: time.monotonic() - start


def first_line(text: str, limit: int = 160) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters for the table."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


EXACT_MATCH_REWARD = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return float(solution_str.strip() == ground_truth)\n"
)
"""A reward file in verl's signature: 1 for the exact reversed letters, else 0."""


def tiny_grpo_task(scratch: Path) -> list[str]:
    """A tiny random Llama, 16 reversed-letters rows and :data:`EXACT_MATCH_REWARD` written
    into ``scratch``: the ``hybridflow grpo`` overrides naming them (a case adds its own
    batch sizes, backend and outputs)."""
    from hf_algos.data import write_rows
    from hf_algos.examples.reverse_letters import (
        ModelShape,
        build_model_dir,
        make_reverse_letters_rows,
    )

    shape = ModelShape(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    model = build_model_dir(scratch / "model", shape, seed=0)
    write_rows(make_reverse_letters_rows(16, 3, seed=0), scratch / "train.jsonl")
    (scratch / "reward.py").write_text(EXACT_MATCH_REWARD)
    return [
        f"actor.engine.model.path={model}",
        f"data.train_files=[{scratch / 'train.jsonl'}]",
        f"reward.function_path={scratch / 'reward.py'}",
    ]
