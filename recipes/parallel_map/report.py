"""What one run measured, and turning runs into the printed table and ``result.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_controller import CallTiming
from recipes.parallel_map.counts import WordCounts

PHASES = ("dispatch", "execute", "collect")


@dataclass
class RunResult:
    """One pass over the corpus with a fixed number of workers."""

    workers: int
    """Worker processes in the group."""
    backend: str
    """``"ray"`` or ``"local"``."""
    counts: WordCounts
    """Merged counts over every file."""
    start_seconds: float
    """Creating the worker group (processes started, ready for calls)."""
    map_seconds: float
    """Wall time of every ``count_words`` call, from the first dispatch to the last collect."""
    phases: dict[str, float]
    """Seconds per phase (dispatch / execute / collect) summed over the calls."""
    timings: list[CallTiming] = field(default_factory=list)
    """Every phase of every call, for the Chrome trace."""

    @property
    def label(self) -> str:
        """``"1 worker"`` / ``"2 workers"``."""
        return worker_label(self.workers)

    def megabytes_per_second(self) -> float:
        """Throughput of the map step."""
        return self.counts.bytes / 1e6 / max(self.map_seconds, 1e-9)


def worker_label(workers: int) -> str:
    """``"1 worker"`` / ``"2 workers"``."""
    return f"{workers} worker{'s' if workers != 1 else ''}"


def speedup(baseline: RunResult, parallel: RunResult) -> float:
    """How many times faster the parallel map step was than the baseline's."""
    return baseline.map_seconds / max(parallel.map_seconds, 1e-9)


def format_counts(counts: WordCounts, top_k: int) -> str:
    """Totals and the ``top_k`` most frequent words with their share of all words."""
    total = counts.total_words
    lines = [
        f"files {counts.files:,}   lines {counts.lines:,}   words {total:,}   "
        f"distinct {len(counts.words):,}   bytes {counts.bytes:,}",
        f"top {top_k} words:",
    ]
    for rank, (word, count) in enumerate(counts.top(top_k), start=1):
        lines.append(f"  {rank:>3}. {word:<16} {count:>12,}  {100 * count / max(total, 1):5.2f}%")
    return "\n".join(lines)


def format_timings(runs: list[RunResult]) -> str:
    """A table of start-up, per-phase and map seconds, throughput and speed-up per run."""
    header = f"{'run':<20}{'start':>8}" + "".join(f"{p:>10}" for p in PHASES)
    header += f"{'map':>9}{'MB/s':>8}{'speed-up':>10}"
    lines = [header]
    for run in runs:
        row = f"{run.label + ' (' + run.backend + ')':<20}{run.start_seconds:>8.2f}"
        row += "".join(f"{run.phases.get(p, 0.0):>10.2f}" for p in PHASES)
        row += f"{run.map_seconds:>9.2f}{run.megabytes_per_second():>8.1f}"
        row += f"{speedup(runs[0], run):>9.2f}x"
        lines.append(row)
    return "\n".join(lines)


def write_result(path: Path, runs: list[RunResult], top_k: int, config: dict[str, Any]) -> None:
    """Save the counts summary, the top words and each run's timings as JSON."""
    counts = runs[-1].counts
    result = {
        "config": config,
        "files": counts.files,
        "lines": counts.lines,
        "bytes": counts.bytes,
        "words": counts.total_words,
        "distinct_words": len(counts.words),
        "top_words": counts.top(top_k),
        "runs": [
            {
                "workers": run.workers,
                "backend": run.backend,
                "start_seconds": run.start_seconds,
                "map_seconds": run.map_seconds,
                "phases": run.phases,
                "speedup": speedup(runs[0], run),
            }
            for run in runs
        ],
    }
    path.write_text(json.dumps(result, indent=2))
