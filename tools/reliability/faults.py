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
