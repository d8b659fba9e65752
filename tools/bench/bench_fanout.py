"""The driver's cost of a group call as the group grows: direct fan-out vs the relay tree.

For each group size (``--sizes``, light workers: hf-controller only, no torch), one
``RayWorkerGroup`` with relays (``--fanout``) is started, and three contenders call the
same workers side by side, in interleaved blocks of ``--block`` calls (shuffled order):

* **raw Ray**: ``ray.get([w.noop.remote() for w in workers])``;
* **direct**: the group's ``Dispatch.ONE_TO_ALL`` call with relays switched off
  (``group.use_relays = False``), one ``.remote()`` per rank, the path before relays;
* **relay tree**: the same call through the tree (the default for groups larger than the
  fan-out).

Per block it reads the driver's CPU time (``time.process_time``: all its threads), the
wall time and the CPU time of the whole machine (``/proc/stat``); figures are medians over
blocks, per call. The driver's CPU is read :data:`SETTLE_S` after a block's last call, so the
work Ray defers after a call (freeing its object refs) counts for the contender that made
it. The whole machine's CPU per call divided by its cores is the floor the
wall time cannot go below on this machine (every worker must wake up and answer).

It also times the group's start-up against N (light workers; a raw Ray floor: as many
actors with no runtime environment; workers that import torch, ``--heavy-sizes``), and a
``DP_COMPUTE_PROTO`` round trip of a DataProto (``--data-sizes`` MiB on
``--data-workers``) direct, through the tree and with raw Ray + a numpy join on the driver.

Run from the repository root, with nothing else running::

    .venv/bin/python tools/bench/bench_fanout.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_support import keep_ray_local, machine_line, start_ray, write_section

from hf_controller import Dispatch, RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, Worker
from hf_controller import register as hf_register

SECTION_KEY = "driver_fanout"
SECTION_TITLE = "## Driver fan-out: group calls from 8 to 128 workers, direct vs relay tree"
CONTENDERS = ("raw Ray", "direct", "relay tree")
SETTLE_S = 0.3
"""After each block, the driver's CPU is read this much later: Ray frees a call's object
refs in the driver's background threads after the call returned, and without the wait
that work of one contender's block (128 refs a call, direct) was counted in the next
block, whichever contender it was. The idle driver's own CPU in that time (about 2.4 ms a
second here) adds at most 0.04 ms a call over a block of 20."""


def progress(line: str) -> None:
    """A progress line on stderr."""
    print(line, file=sys.stderr, flush=True)


class FanWorker(Worker):
    """A light worker: a no-op, and an echo of its DataProto shard."""

    @hf_register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        """Do nothing on every rank."""
        return None

    @hf_register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: Any) -> Any:
        """Read both ends of every column of this rank's shard, return it."""
        for column in data.batch.values():
            flat = column.reshape(-1)
            float(flat[0]) + float(flat[-1])
        return data

    def echo_raw(self, columns: dict[str, Any]) -> dict[str, Any]:
        """The raw Ray twin of :meth:`echo` (numpy columns, no dispatch)."""
        for key, column in columns.items():
            if key != "uid":
                flat = column.reshape(-1)
                float(flat[0]) + float(flat[-1])
        return columns


class TorchWorker(Worker):
    """A heavy worker: imports torch when it starts, as every engine worker does."""

    def __init__(self) -> None:
        super().__init__()
        import torch

        self.threads = torch.get_num_threads()

    @hf_register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        """Do nothing on every rank."""
        return None


class RawActor:
    """A plain actor with nothing to import: the start-up floor."""

    def noop(self) -> None:
        """Do nothing."""
        return None


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(v) for v in fields]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class CallCosts:
    """Per-call medians of one contender at one size."""

    driver_cpu_ms: float
    wall_ms: float
    machine_cpu_ms: float


@dataclass
class SizeResult:
    """Everything measured at one group size."""

    size: int
    start_s: float
    raw_start_s: float | None
    costs: dict[str, CallCosts] = field(default_factory=dict)


def contenders(group: Any) -> dict[str, Callable[[], Any]]:
    """The three ways to make one no-op call on ``group``'s workers."""
    import ray

    workers = group.workers

    def raw() -> Any:
        return ray.get([w.noop.remote() for w in workers])

    def direct() -> Any:
        group.use_relays = False
        try:
            return group.noop()
        finally:
            group.use_relays = True

    return {"raw Ray": raw, "direct": direct, "relay tree": group.noop}


def measure_calls(
    group: Any, blocks: int, block: int, settle_s: float = SETTLE_S
) -> dict[str, CallCosts]:
    """Median per-call costs of every contender over ``blocks`` interleaved blocks; a
    block's driver CPU includes the ``settle_s`` after its calls (:data:`SETTLE_S`)."""
    calls = contenders(group)
    for call in calls.values():  # warm-up: first calls start relays' and workers' paths
        for _ in range(block):
            call()
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in calls}
    rng = random.Random(0)
    for _ in range(blocks):
        for name in rng.sample(list(calls), len(calls)):
            cpu, wall, busy = time.process_time(), time.perf_counter(), machine_busy_s()
            for _ in range(block):
                calls[name]()
            wall, busy = time.perf_counter() - wall, machine_busy_s() - busy
            time.sleep(settle_s)  # this block's deferred work (freeing refs) counts for it
            cpu = time.process_time() - cpu
            samples[name].append((cpu / block, wall / block, busy / block))
    return {
        name: CallCosts(*(1000 * statistics.median(s[i] for s in rows) for i in range(3)))
        for name, rows in samples.items()
    }


def raw_start(size: int) -> float:
    """Seconds to start ``size`` plain zero-CPU actors and hear from all of them."""
    import ray

    start = time.perf_counter()
    actor_class: Any = ray.remote(RawActor)
    actors = [actor_class.options(num_cpus=0).remote() for _ in range(size)]
    ray.get([a.noop.remote() for a in actors])
    elapsed = time.perf_counter() - start
    for actor in actors:
        ray.kill(actor)
    return elapsed


def start_group(size: int, fanout: int) -> tuple[Any, float]:
    """A group of ``size`` light workers with relays, and the seconds it took to answer."""
    start = time.perf_counter()
    pool = RayResourcePool([size], use_gpu=False, cpus_per_worker=0.01)
    group: Any = RayWorkerGroup(
        pool, RayClassWithInitArgs(FanWorker), name_prefix=f"fan{size}", relay_fanout=fanout
    )
    group.noop()  # the relays are up too
    return group, time.perf_counter() - start


def heavy_start(size: int) -> float:
    """Seconds to start a group of ``size`` workers that import torch, and hear from all."""
    start = time.perf_counter()
    pool = RayResourcePool([size], use_gpu=False, cpus_per_worker=0.01)
    group: Any = RayWorkerGroup(pool, RayClassWithInitArgs(TorchWorker), name_prefix=f"torch{size}")
    group.noop()
    elapsed = time.perf_counter() - start
    group.shutdown()
    time.sleep(2)
    progress(f"{size} torch workers: started in {elapsed:.1f}s")
    return elapsed


def measure_size(args: argparse.Namespace, size: int) -> SizeResult:
    """Start-up and call costs at one group size."""
    raw_s = raw_start(size) if size in args.raw_start_sizes else None
    group, start_s = start_group(size, args.fanout)
    progress(f"{size} workers: started in {start_s:.1f}s (raw Ray floor {raw_s})")
    result = SizeResult(size, start_s, raw_s)
    result.costs = measure_calls(group, args.blocks, args.block, args.settle_s)
    group.shutdown()
    time.sleep(2)  # let the killed processes go before the next size starts
    for name, cost in result.costs.items():
        progress(f"  {name}: driver {cost.driver_cpu_ms:.2f} ms, wall {cost.wall_ms:.2f} ms")
    return result


# ---------------------------------------------------------------------- data round trip


def data_cases(group: Any, mib: int) -> tuple[dict[str, Callable[[], Any]], int]:
    """The three round trips of a ``mib`` MiB batch on ``group``'s workers, and its rows."""
    import itertools

    import numpy as np
    import ray
    from bench_dataproto_transport import build_hf_dataproto, build_numpy_dict, make_rl_batch

    batch = make_rl_batch(mib)
    data = build_hf_dataproto(batch)
    columns = build_numpy_dict(batch)
    bounds = np.linspace(0, len(batch.uid), group.world_size + 1).astype(int)
    parts = [{k: v[a:b] for k, v in columns.items()} for a, b in itertools.pairwise(bounds)]
    workers = group.workers

    def raw_join() -> Any:
        back = ray.get([w.echo_raw.remote(p) for w, p in zip(workers, parts, strict=True)])
        return {k: np.concatenate([p[k] for p in back]) for k in back[0]}

    def direct() -> Any:
        group.use_relays = False
        try:
            return group.echo(data)
        finally:
            group.use_relays = True

    cases = {"raw Ray + join": raw_join, "direct": direct, "relay tree": lambda: group.echo(data)}
    return cases, len(batch.uid)


def measure_data(args: argparse.Namespace, size: int) -> list[tuple[int, str, float]]:
    """``(MiB, contender, median ms)`` of DP_COMPUTE_PROTO round trips on ``size`` workers."""
    group, _ = start_group(size, args.fanout)
    rows: list[tuple[int, str, float]] = []
    for mib in args.data_sizes:
        cases, count = data_cases(group, mib)
        times: dict[str, list[float]] = {name: [] for name in cases}
        rng = random.Random(1)
        for round_index in range(args.data_warmup + args.data_repeats):
            for name in rng.sample(list(cases), len(cases)):
                start = time.perf_counter()
                out = cases[name]()
                elapsed = time.perf_counter() - start
                assert len(out["uid"] if isinstance(out, dict) else out) == count
                if round_index >= args.data_warmup:
                    times[name].append(elapsed)
        rows += [(mib, name, 1000 * statistics.median(t)) for name, t in times.items()]
        done = ", ".join(f"{name} {ms:.0f} ms" for _, name, ms in rows[-3:])
        progress(f"  data {mib} MiB on {size}: {done}")
    group.shutdown()
    return rows


# ---------------------------------------------------------------------- report


def report(
    args: argparse.Namespace,
    results: list[SizeResult],
    heavy: dict[int, float],
    data: dict[int, list[tuple[int, str, float]]],
) -> str:
    """The markdown block of this run."""
    cores = os.cpu_count() or 1
    lines = [
        f"Measured on {machine_line(['ray', 'hf_controller', 'torch'])}; Ray started with "
        f"{args.ray_cpus} logical CPUs, light workers (0.01 CPU each), relay fan-out "
        f"{args.fanout}. Medians over {args.blocks} interleaved blocks of {args.block} calls; "
        f"a block's driver CPU read {args.settle_s:g} s after its last call. "
        f'"relay tree" is the group\'s default path: groups of at most {args.fanout} '
        f"ranks are called directly, larger ones through relays.",
        "",
        "| workers | start-up (s) | raw Ray start-up floor (s) | driver CPU: raw Ray (ms) | "
        "driver CPU: direct (ms) | driver CPU: relay tree (ms) | wall: raw Ray (ms) | "
        "wall: direct (ms) | wall: relay tree (ms) | floor: machine CPU / cores, tree (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        c = r.costs
        raw_s = f"{r.raw_start_s:.1f}" if r.raw_start_s is not None else ""
        lines.append(
            f"| {r.size} | {r.start_s:.1f} | {raw_s} | "
            + " | ".join(f"{c[n].driver_cpu_ms:.2f}" for n in CONTENDERS)
            + " | "
            + " | ".join(f"{c[n].wall_ms:.2f}" for n in CONTENDERS)
            + f" | {c['relay tree'].machine_cpu_ms / cores:.2f} |"
        )
    first, last = results[0], results[-1]
    for name in ("direct", "relay tree"):
        growth = last.costs[name].driver_cpu_ms / first.costs[name].driver_cpu_ms
        verdict = "meets" if growth <= 2 else "MISSES"
        lines.append("")
        lines.append(
            f"Driver CPU per call, {name}, {first.size} -> {last.size} workers: {growth:.2f}x "
            f"(target at most 2x: {verdict})."
        )
    if heavy:
        lines += [
            "",
            "Start-up of workers that import torch (seconds until all answer a call):",
            "",
        ]
        lines += ["| workers | " + " | ".join(str(n) for n in heavy) + " |"]
        lines += ["|---|" + "---:|" * len(heavy)]
        lines += ["| start-up (s) | " + " | ".join(f"{t:.1f}" for t in heavy.values()) + " |"]
    for size, rows in data.items():
        lines += [
            "",
            f"DP_COMPUTE_PROTO round trip on {size} workers (median of {args.data_repeats}):",
            "",
            "| MiB | raw Ray + join (ms) | direct (ms) | relay tree (ms) | tree / raw + join |",
            "|---:|---:|---:|---:|---:|",
        ]
        for mib in args.data_sizes:
            by = {name: ms for m, name, ms in rows if m == mib}
            ratio = by["relay tree"] / by["raw Ray + join"]
            cells = " | ".join(f"{by[n]:.1f}" for n in ("raw Ray + join", "direct", "relay tree"))
            lines.append(f"| {mib} | {cells} | {ratio:.2f}x |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    parser.add_argument("--raw-start-sizes", type=int, nargs="*", default=[8, 32, 64, 128])
    parser.add_argument("--fanout", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument(
        "--settle-s",
        type=float,
        default=SETTLE_S,
        help="seconds after a block before its driver CPU is read (0: read at once)",
    )
    parser.add_argument("--heavy-sizes", type=int, nargs="*", default=[8, 16, 32])
    parser.add_argument("--data-workers", type=int, nargs="*", default=[8, 32])
    parser.add_argument("--data-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--data-repeats", type=int, default=15)
    parser.add_argument("--data-warmup", type=int, default=2)
    parser.add_argument("--ray-cpus", type=int, default=16)
    parser.add_argument("--object-store-gb", type=float, default=4.0)
    parser.add_argument("--output", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (or write) its block."""
    args = parse_args(argv)
    keep_ray_local()
    start_ray(args.object_store_gb, num_cpus=args.ray_cpus)
    results = [measure_size(args, size) for size in args.sizes]
    heavy = {size: heavy_start(size) for size in args.heavy_sizes}
    data = {size: measure_data(args, size) for size in args.data_workers}
    body = report(args, results, heavy, data)
    print(body)
    if args.output is not None:
        write_section(args.output, SECTION_KEY, SECTION_TITLE, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
