"""What a worker-group call costs on top of Ray: hf-controller vs raw Ray vs verl 0.9.1.

Everything runs in one local Ray node, the three contenders side by side
(``controller_groups.py`` holds their worker classes, ``controller_report.py`` the
tables):

1. **No-op call latency.** Groups of 1, 2, 4 and 8 workers run a method that does
   nothing. raw Ray is ``ray.get([a.noop.remote() for a in actors])``; both
   controllers call a ``Dispatch.ONE_TO_ALL`` method of their ``RayWorkerGroup``.
   Every call is timed on its own; after ``--warmup`` calls per contender, the
   ``--calls`` timed calls run in ``--blocks`` interleaved blocks (each block calls
   every contender in turn, in a shuffled order) so drift on a shared machine
   spreads over all of them. The median per call is reported.
2. **DP_COMPUTE_PROTO round trip.** The driver sends an RL batch of 64, 256 or
   1024 MiB (``make_rl_batch`` of ``bench_dataproto_transport.py``) to 2 workers;
   each reads both ends of every column of its half and returns that half; the
   driver gathers. raw Ray passes the columns as numpy arrays, split in two row
   halves, to two plain actors and ``ray.get``s the two halves (the floor); "raw
   Ray + join" also concatenates them on the driver, which is the memory copy a
   DP_COMPUTE_PROTO collect has to do. The controllers call a DP_COMPUTE_PROTO
   method with their own DataProto (chunk, call, ``DataProto.concat``). Every
   result is checked (row count and both ends of every column). Each round runs
   every case once (in a shuffled order); after ``--warmup-rounds`` untimed
   rounds, medians are reported, with hf-controller's own dispatch / execute /
   collect split (``RayWorkerGroup.timings``) to show where its time goes.

Ray is started with ``--ray-cpus`` (16) *logical* CPUs whatever the machine has:
verl's CPU workers each ask for one CPU inside a one-CPU bundle, so 8 of them do not
fit the 2 logical CPUs of a 2-core machine. The logical count only lets Ray place
the actors; all of them still share the real cores.

Run from the repository root (``setup_verl_venv.sh`` builds a venv with verl,
hf-controller and hf-protocol side by side)::

    bash tools/bench/setup_verl_venv.sh
    tools/bench/.venv-verl/bin/python tools/bench/bench_controller.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_support import (
    import_problem,
    keep_ray_local,
    machine_line,
    prime_object_store,
    start_ray,
    write_section,
)
from controller_report import (
    HF,
    RAW,
    RAW_JOIN,
    VERL,
    LatencyResult,
    PhaseSplit,
    TransferResult,
    report_body,
)

TRANSFER_WORKERS = 2
LARGE_MIB = 1024  # sizes from here on run --large-repeats rounds
SECTION_KEY = "controller_overhead"
SECTION_TITLE = "## Worker-group call overhead: hf-controller vs raw Ray and verl"


def progress(line: str) -> None:
    """A progress line on stderr (the tables go to stdout)."""
    print(line, file=sys.stderr, flush=True)


def shuffled(items: list[Any], rng: random.Random) -> list[Any]:
    """A shuffled copy of ``items``.

    Running cases in a new order each round keeps any effect of one case on the next
    (a large free just before, a cache just warmed) from always landing on the same
    case, which a fixed or merely rotated order does.
    """
    order = list(items)
    rng.shuffle(order)
    return order


# ---------------------------------------------------------------------------- latency


def noop_calls(groups: Any) -> dict[str, Callable[[], Any]]:
    """One no-op group call per contender."""
    import ray

    raw = groups.raw
    calls = {
        RAW: lambda: ray.get([actor.noop.remote() for actor in raw]),
        HF: groups.hf.noop,
    }
    if groups.verl is not None:
        calls[VERL] = groups.verl.noop
    return calls


def time_calls(call: Callable[[], Any], count: int, times: list[float]) -> None:
    """Run ``call`` ``count`` times, appending the duration of each to ``times``."""
    for _ in range(count):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)


def measure_latency(groups: Any, calls: int, warmup: int, blocks: int) -> list[LatencyResult]:
    """Per-call times of every contender, interleaved in ``blocks`` blocks.

    Each block calls every contender in turn, in a shuffled order (seeded, so a
    rerun uses the same orders).
    """
    rng = random.Random(groups.size)
    contenders = noop_calls(groups)
    for call in contenders.values():
        time_calls(call, warmup, [])
    labels = list(contenders)
    times: dict[str, list[float]] = {label: [] for label in labels}
    per_block = max(1, calls // blocks)
    for _ in range(blocks):
        for label in shuffled(labels, rng):
            time_calls(contenders[label], per_block, times[label])
    return [LatencyResult(groups.size, label, times[label]) for label in labels]


# ---------------------------------------------------------------------------- transfer


@dataclass(frozen=True)
class TransferCase:
    """One way of moving a batch driver -> 2 workers -> driver."""

    label: str
    run: Callable[[], Any]
    """The timed call; returns what the driver gathered."""
    parts: Callable[[Any], list[dict[str, Any]]]
    """The gathered result as row parts in order, each a dict of columns (not timed)."""


def rows_and_ends(parts: list[dict[str, Any]]) -> tuple[int, float]:
    """Row count, plus the sum over numeric columns of the first element in the first
    part and the last element in the last part."""
    first, last = parts[0], parts[-1]
    numeric = [key for key in first if key != "uid"]
    ends = sum(float(first[k].reshape(-1)[0]) + float(last[k].reshape(-1)[-1]) for k in numeric)
    return sum(len(part["uid"]) for part in parts), ends


def dataproto_parts(data: Any) -> list[dict[str, Any]]:
    """A gathered DataProto (either kind) as one part."""
    return [{**dict(data.batch.items()), "uid": data.non_tensor_batch["uid"]}]


def numpy_halves(batch: Any) -> list[dict[str, Any]]:
    """The batch as two row halves of numpy arrays (views: nothing is copied here)."""
    from bench_dataproto_transport import build_numpy_dict

    columns = build_numpy_dict(batch)
    middle = (len(batch.uid) + 1) // 2
    return [
        {key: value[:middle] for key, value in columns.items()},
        {key: value[middle:] for key, value in columns.items()},
    ]


def join_halves(halves: list[dict[str, Any]]) -> dict[str, Any]:
    """The two halves concatenated column by column, as a DP_COMPUTE_PROTO collect does."""
    import numpy as np

    return {key: np.concatenate([half[key] for half in halves]) for key in halves[0]}


def transfer_cases(groups: Any, batch: Any) -> list[TransferCase]:
    """The cases at one batch size; payloads are built here, outside the timed calls."""
    import ray
    from bench_dataproto_transport import build_hf_dataproto, build_verl_dataproto

    actors = groups.raw[:TRANSFER_WORKERS]
    halves = numpy_halves(batch)

    def raw_round_trip() -> list[dict[str, Any]]:
        return ray.get([a.echo.remote(h) for a, h in zip(actors, halves, strict=True)])

    hf_data = build_hf_dataproto(batch)
    cases = [
        TransferCase(RAW, raw_round_trip, list),
        TransferCase(RAW_JOIN, lambda: join_halves(raw_round_trip()), lambda joined: [joined]),
        TransferCase(HF, lambda: groups.hf.echo(hf_data), dataproto_parts),
    ]
    if groups.verl is not None:
        verl_data = build_verl_dataproto(batch)
        cases.append(TransferCase(VERL, lambda: groups.verl.echo(verl_data), dataproto_parts))
    return cases


def timed_round_trip(case: TransferCase, expected: tuple[int, float]) -> float:
    """Run ``case`` once; raise if what came back differs from what was sent."""
    start = time.perf_counter()
    gathered = case.run()
    elapsed = time.perf_counter() - start
    got = rows_and_ends(case.parts(gathered))
    if got != expected:
        raise RuntimeError(f"{case.label} returned other data: (rows, ends) {got} != {expected}")
    del gathered
    gc.collect()  # free the result (and the store objects behind it) before the next case
    return elapsed


def measure_transfer(
    groups: Any, size_mib: int, warmups: int, repeats: int
) -> tuple[list[TransferResult], PhaseSplit]:
    """Every case at one batch size: ``warmups`` untimed rounds, then ``repeats`` timed
    ones, each running every case once (in a shuffled order). Also returns
    the medians of hf-controller's own phase timings over the timed rounds."""
    from bench_dataproto_transport import make_rl_batch

    batch = make_rl_batch(size_mib)
    expected = rows_and_ends([{**batch.tensors, "uid": batch.uid}])
    cases = transfer_cases(groups, batch)
    times: dict[str, list[float]] = {case.label: [] for case in cases}
    rng = random.Random(size_mib)
    for round_index in range(warmups + repeats):
        timed = round_index >= warmups
        if round_index == warmups:
            groups.hf.timer.records.clear()  # keep the phase timings of timed rounds only
        for case in shuffled(cases, rng):
            elapsed = timed_round_trip(case, expected)
            if timed:
                times[case.label].append(elapsed)
        label = f"round {round_index - warmups + 1}/{repeats}" if timed else "warm-up round"
        progress(f"  {size_mib} MiB {label} done")
    results = [TransferResult(size_mib, c.label, batch.nbytes, times[c.label]) for c in cases]
    return results, phase_split(groups.hf, size_mib)


def phase_split(group: Any, size_mib: int) -> PhaseSplit:
    """Medians of the group's recorded ``echo`` phases."""

    def median(phase: str) -> float:
        durations = [t.duration for t in group.timings if t.method == "echo" and t.phase == phase]
        return statistics.median(durations) if durations else float("nan")

    return PhaseSplit(size_mib, median("dispatch"), median("execute"), median("collect"))


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add(
        "--workers",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8],
        help="group sizes for the no-op latency (default: 1 2 4 8)",
    )
    add(
        "--calls",
        type=int,
        default=300,
        help="timed no-op calls per contender and group size (default: 300)",
    )
    add(
        "--warmup",
        type=int,
        default=30,
        help="untimed no-op calls per contender before timing (default: 30)",
    )
    add(
        "--blocks",
        type=int,
        default=30,
        help="interleaved blocks the timed calls are split into (default: 30)",
    )
    add(
        "--sizes",
        type=int,
        nargs="*",
        default=[64, 256, 1024],
        help="DP_COMPUTE_PROTO batch sizes in MiB; give none to skip (default: 64 256 1024)",
    )
    add(
        "--repeats",
        type=int,
        default=9,
        help=f"timed rounds per batch size below {LARGE_MIB} MiB (default: 9)",
    )
    add(
        "--warmup-rounds",
        type=int,
        default=3,
        help=f"untimed rounds per batch size below {LARGE_MIB} MiB; larger sizes get one "
        f"(default: 3: the first few transfers into fresh worker processes run slow)",
    )
    add(
        "--large-repeats",
        type=int,
        default=3,
        help=f"timed rounds per batch size of {LARGE_MIB} MiB or more (default: 3)",
    )
    add("--no-verl", action="store_true", help="leave verl out even where it imports")
    add("--ray-cpus", type=int, default=16, help="logical CPUs Ray is started with (default: 16)")
    add(
        "--object-store-gb",
        type=float,
        default=6.0,
        help="Ray object store size in GB (default: 6)",
    )
    add(
        "--output",
        type=Path,
        default=None,
        help="markdown file whose generated section to append or replace",
    )
    args = parser.parse_args(argv)
    for name in ("calls", "warmup", "blocks", "repeats", "warmup_rounds", "large_repeats"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} must be at least 1, got {getattr(args, name)}")
    if args.sizes and TRANSFER_WORKERS not in args.workers:
        parser.error(
            f"--workers must include {TRANSFER_WORKERS} (the round trip runs on that group), "
            f"got {args.workers}; or pass --sizes with no value to skip the round trip"
        )
    return args


@dataclass
class Measurements:
    """Everything one run measured."""

    latency: list[LatencyResult]
    transfer: list[TransferResult]
    phases: list[PhaseSplit]


def measure_group_size(
    args: argparse.Namespace, workers: int, with_verl: bool, out: Measurements
) -> None:
    """Start the three contenders with ``workers`` workers, measure, stop them."""
    from controller_groups import start_groups

    progress(f"{workers} worker(s): starting groups")
    groups = start_groups(workers, with_verl)
    try:
        for result in measure_latency(groups, args.calls, args.warmup, args.blocks):
            out.latency.append(result)
            progress(
                f"  {workers} worker(s) {result.label}: median {result.median_ms:.2f} ms, "
                f"p90 {result.p90_ms:.2f} ms"
            )
        if workers != TRANSFER_WORKERS:
            return
        for size_mib in args.sizes:
            large = size_mib >= LARGE_MIB
            repeats = args.large_repeats if large else args.repeats
            warmups = 1 if large else args.warmup_rounds
            progress(f"DP_COMPUTE_PROTO {size_mib} MiB on {workers} workers, {repeats} rounds")
            results, phases = measure_transfer(groups, size_mib, warmups, repeats)
            out.transfer += results
            out.phases.append(phases)
            for transfer in results:
                progress(f"  {size_mib} MiB {transfer.label}: {transfer.median_s * 1e3:.1f} ms")
            progress(
                f"  {size_mib} MiB {HF} phases: dispatch {phases.dispatch * 1e3:.1f} ms, "
                f"execute {phases.execute * 1e3:.1f} ms, collect {phases.collect * 1e3:.1f} ms"
            )
    finally:
        groups.stop()


def run_header(args: argparse.Namespace, machine: str) -> str:
    """The first line of the generated block: machine, Ray and how much was measured."""
    header = (
        f"Measured on {machine}; Ray started with {args.ray_cpus} logical CPUs. No-op: median "
        f"of {args.calls} calls per contender after {args.warmup} warm-up calls."
    )
    if args.sizes:
        header += (
            f" Round trip: medians of {args.repeats} timed rounds after {args.warmup_rounds} "
            f"warm-up round(s)"
        )
        if max(args.sizes) >= LARGE_MIB:
            header += f" ({args.large_repeats} after one from {LARGE_MIB} MiB)"
        header += "."
    return header


def main(argv: list[str] | None = None) -> int:
    """Run both measurements, print the tables, optionally write the docs section."""
    keep_ray_local()
    args = parse_args(argv)
    notes = []
    verl_problem = None if args.no_verl else import_problem("verl.single_controller.ray")
    if verl_problem is not None:
        notes.append(
            f"verl left out: cannot import verl.single_controller.ray ({verl_problem}); "
            f"run tools/bench/setup_verl_venv.sh and use its python"
        )
        progress(notes[-1])
    with_verl = not args.no_verl and verl_problem is None
    ray = start_ray(args.object_store_gb, num_cpus=args.ray_cpus)
    out = Measurements([], [], [])
    started = time.perf_counter()
    try:
        prime_object_store(ray, args.object_store_gb)
        for workers in args.workers:
            measure_group_size(args, workers, with_verl, out)
        machine = machine_line(["ray", "torch", "numpy", "tensordict", "hf_controller", "verl"])
    finally:
        ray.shutdown()
    progress(f"done in {time.perf_counter() - started:.0f} s")
    body = report_body(run_header(args, machine), out.latency, out.transfer, out.phases, notes)
    print(body)
    if args.output is not None:
        write_section(args.output, SECTION_KEY, SECTION_TITLE, body)
        progress(f"wrote results to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
