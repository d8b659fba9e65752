"""Parallel word count over a folder of text files: a map-reduce on hf-controller alone.

What it really is: the file list is split into balanced parts, one per worker
process; each worker reads its files and counts words, lines and bytes (map);
the per-worker counts are summed as they come back (reduce, in the group's
collect step). It runs once with one worker and once with N, checks that both
give the same counts, and prints the counts, the timings and the speed-up.
Only Ray is needed: no torch, no numpy.

Run from the repository root::

    python -m recipes.parallel_map.main                 # ~160 MB synthetic corpus, 2 workers
    python -m recipes.parallel_map.main --small         # a few seconds
    python -m recipes.parallel_map.main --input-dir ~/books --pattern '*.txt' --workers 4
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_controller import (
    RayClassWithInitArgs,
    RayResourcePool,
    ensure_ray,
    export_chrome_trace,
    make_worker_group,
)
from recipes.parallel_map.config import ParallelMapConfig, field_docs
from recipes.parallel_map.corpus import generate_corpus
from recipes.parallel_map.counts import WordCounts
from recipes.parallel_map.files import FileList, find_text_files, total_bytes
from recipes.parallel_map.report import (
    RunResult,
    format_counts,
    format_timings,
    speedup,
    worker_label,
    write_result,
)
from recipes.parallel_map.worker import WordCountWorker


def prepare_files(config: ParallelMapConfig) -> FileList:
    """The files to count: ``input_dir``'s, or a synthetic corpus (written once, then reused)."""
    if config.input_dir is not None:
        return find_text_files(config.input_dir, config.pattern)
    corpus_dir = Path(config.output_dir) / "corpus"
    print(f"synthetic corpus: {config.corpus_files} files, {config.corpus_mb:g} MB in {corpus_dir}")
    started = time.perf_counter()
    files = generate_corpus(corpus_dir, config.corpus_files, config.corpus_mb, config.seed)
    print(f"  ready in {time.perf_counter() - started:.1f}s (reused when the arguments match)")
    return files


def read_through(files: FileList) -> None:
    """Read every file once, so no run pays for disk reads that a later run would skip."""
    for path in files:
        Path(path).read_bytes()


def count_in_rounds(group: Any, files: FileList, rounds: int, label: str) -> WordCounts:
    """Count ``files`` with ``rounds`` calls of ``group.count_words``, printing progress."""
    total = WordCounts()
    size = total_bytes(files)
    started = time.perf_counter()
    parts = [part for part in files.chunk(min(rounds, len(files))) if len(part)]
    for index, part in enumerate(parts, start=1):
        total = WordCounts.concat([total, group.count_words(part)])
        elapsed = time.perf_counter() - started
        end = "\n" if index == len(parts) or not sys.stdout.isatty() else "\r"
        print(
            f"  [{label}] round {index}/{len(parts)}: {total.files}/{len(files)} files, "
            f"{total.bytes / 1e6:.0f}/{size / 1e6:.0f} MB, "
            f"{total.bytes / 1e6 / max(elapsed, 1e-9):.1f} MB/s",
            end=end,
            flush=True,
        )
    return total


def run_once(files: FileList, workers: int, backend: str, rounds: int) -> RunResult:
    """Start a group of ``workers``, count ``files`` with it, and shut the group down."""
    name = f"wordcount_{workers}w"
    pool = RayResourcePool([workers], use_gpu=False, name_prefix=name)
    group = None
    try:
        started = time.perf_counter()
        group = make_worker_group(
            pool, RayClassWithInitArgs(cls=WordCountWorker), name_prefix=name, backend=backend
        )
        # One empty call outside the timer (execute_all skips it), so the timed rounds do
        # not include the first call's one-off costs in the worker processes.
        group.execute_all_sync("count_words", FileList(()))
        start_seconds = time.perf_counter() - started
        started = time.perf_counter()
        counts = count_in_rounds(group, files, rounds, worker_label(workers))
        map_seconds = time.perf_counter() - started
    finally:
        if backend == "ray":
            if group is not None:
                group.kill()
            pool.release()
    phases = group.timer.summary().get("count_words", {})
    return RunResult(workers, backend, counts, start_seconds, map_seconds, phases, group.timings)


def run_recipe(config: ParallelMapConfig) -> list[RunResult]:
    """Setup -> run (1 worker, then ``config.workers``) -> report. Returns the runs.

    Raises:
        RuntimeError: the runs disagree on the counts (which would be a bug).
    """
    files = prepare_files(config)
    if config.backend == "ray":
        ensure_ray()  # started here so its seconds do not count as the first group's start-up
    read_through(files)
    print(f"counting {len(files)} files, {total_bytes(files) / 1e6:.1f} MB ({config.backend})")

    single_first = config.compare_single and config.workers > 1
    sizes = [1, config.workers] if single_first else [config.workers]
    runs = [run_once(files, workers, config.backend, config.rounds) for workers in sizes]
    if any(run.counts != runs[0].counts for run in runs[1:]):
        raise RuntimeError("the runs counted different totals; please report this as a bug")

    print(format_counts(runs[-1].counts, config.top_k))
    print(format_timings(runs))
    if len(runs) > 1:
        print(f"speed-up with {runs[-1].label}: {speedup(runs[0], runs[-1]):.2f}x")
    output = Path(config.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    write_result(output / "result.json", runs, config.top_k, dataclasses.asdict(config))
    export_chrome_trace([t for run in runs for t in run.timings], output / "trace.json")
    print(f"wrote {output / 'result.json'} and {output / 'trace.json'} (open in ui.perfetto.dev)")
    return runs


def parse_args(argv: Sequence[str] | None = None) -> ParallelMapConfig:
    """The config from command-line flags (one flag per config field, plus ``--small``)."""
    defaults = ParallelMapConfig()
    docs = field_docs(ParallelMapConfig)
    parser = argparse.ArgumentParser(
        prog="python -m recipes.parallel_map.main",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--small", action="store_true", help=ParallelMapConfig.small.__doc__)
    for field in dataclasses.fields(ParallelMapConfig):
        flag = "--" + field.name.replace("_", "-")
        default = getattr(defaults, field.name)
        help_text = f"{docs.get(field.name, '')} (default: {default})".replace("%", "%%")
        if isinstance(default, bool):
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            kind = type(default) if default is not None else str
            parser.add_argument(flag, type=kind, default=None, help=help_text)
    args = vars(parser.parse_args(argv))
    small = args.pop("small")
    overrides = {key: value for key, value in args.items() if value is not None}
    try:
        return ParallelMapConfig.small(**overrides) if small else ParallelMapConfig(**overrides)
    except ValueError as error:
        parser.error(str(error))  # exits with the message and the usage line
        raise  # unreachable: parser.error exits


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; stops the Ray it started on the way out."""
    config = parse_args(argv)
    try:
        run_recipe(config)
    finally:
        if config.backend == "ray" and "ray" in sys.modules:
            import ray

            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
