"""Per-call timings of worker-group methods, exportable as a Chrome trace.

Every bound group method records three phases: *dispatch* (splitting the
arguments), *execute* (running on the workers, waiting included when blocking)
and *collect* (gathering the results). ``export_chrome_trace`` writes them in the
Trace Event format, which chrome://tracing and https://ui.perfetto.dev open.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class CallTiming:
    """One phase of one group call, in seconds since the epoch."""

    group: str
    method: str
    phase: str
    start: float
    end: float

    @property
    def duration(self) -> float:
        """Length of the phase in seconds."""
        return self.end - self.start


class CallTimer:
    """Collects :class:`CallTiming` records for one worker group (the latest ``max_records``)."""

    def __init__(self, group: str, max_records: int = 100_000) -> None:
        self.group = group
        self.records: collections.deque[CallTiming] = collections.deque(maxlen=max_records)

    @contextlib.contextmanager
    def phase(self, method: str, phase: str) -> Iterator[None]:
        """Time the enclosed block as ``phase`` of a call to ``method``."""
        start = time.time()
        try:
            yield
        finally:
            self.records.append(CallTiming(self.group, method, phase, start, time.time()))

    def summary(self) -> dict[str, dict[str, float]]:
        """Total seconds per ``method`` and phase."""
        totals: dict[str, dict[str, float]] = {}
        for record in self.records:
            method = totals.setdefault(record.method, {})
            method[record.phase] = method.get(record.phase, 0.0) + record.duration
        return totals


def export_chrome_trace(records: Iterable[CallTiming], path: str | os.PathLike[str]) -> str:
    """Write ``records`` as a Chrome Trace Event JSON file and return its path.

    One process row per group, one thread row per phase.
    """
    records = list(records)
    groups = sorted({r.group for r in records})
    phases = ["dispatch", "execute", "collect"]
    events: list[dict[str, object]] = []
    for pid, group in enumerate(groups):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": group}})
        for tid, phase in enumerate(phases):
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": phase}}
            )
    for record in records:
        events.append(
            {
                "ph": "X",
                "name": record.method,
                "cat": record.phase,
                "pid": groups.index(record.group),
                "tid": phases.index(record.phase) if record.phase in phases else len(phases),
                "ts": record.start * 1e6,
                "dur": record.duration * 1e6,
                "args": asdict(record),
            }
        )
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, handle)
    return os.fspath(path)
