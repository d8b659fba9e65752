"""Throughput of a DataProto round trip through Ray's object store.

What is measured: for each batch size, ``ray.get(ray.put(x))`` in the driver of one
local Ray node, followed by a consumer that reads one element of every column (so a
result that was never really materialised cannot look fast). ``put`` serialises and
copies into shared memory; ``get`` deserialises from it. Nothing crosses a network:
this is the same-node cost every worker group pays. Rounds are interleaved (each
round runs every case once), one warm-up round is dropped, and the table reports the
medians of ``--repeats`` rounds. The object store is written over once before any
timing, so no case pays for first-touch page faults that later cases skip.

The cases carry the same bytes (an RL batch, see :func:`make_rl_batch`):

* ``numpy dict`` - a plain dict of numpy arrays. Ray stores these zero-copy, so this
  is the physical reference every other case is divided by.
* ``hf-protocol`` - ``hf_protocol.DataProto``, whose pickled state hands tensor bytes
  to Ray as out-of-band buffers (``hf_protocol.transport``).
* ``hf-protocol, copy on receive`` - the same with ``HF_PROTOCOL_COPY_ON_RECEIVE=1``,
  which copies every tensor out of the object store on arrival.
* ``verl`` - ``verl.protocol.DataProto`` (pickles its TensorDict through ``torch.save``)
  and verl's own numpy serialisation mode. Skipped with a message when verl cannot be
  imported; ``tools/bench/setup_verl_venv.sh`` builds a venv where it can.

Run from the repository root::

    bash tools/bench/setup_verl_venv.sh
    tools/bench/.venv-verl/bin/python tools/bench/bench_dataproto_transport.py \
        --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from bench_support import (
    GB,
    MIB,
    import_problem,
    keep_ray_local,
    machine_line,
    prime_object_store,
    scoped_env,
    start_ray,
    write_section,
)

PROMPT_LEN = 1024
RESPONSE_LEN = 1024
TARGET_RATIO = 0.8
SECTION_KEY = "dataproto_transport"
SECTION_TITLE = "## DataProto transport through Ray's object store"


# ---------------------------------------------------------------------------- the batch


@dataclass
class RLBatch:
    """One RL training batch as columns.

    ``tensors``: ``input_ids``, ``attention_mask``, ``position_ids`` int64
    ``(b, prompt_len + response_len)``; ``responses`` int64 ``(b, response_len)``;
    ``old_log_probs``, ``advantages`` float32 ``(b, response_len)``.
    ``uid``: object array of ``b`` strings (the prompt group id, as in GRPO).
    """

    tensors: dict[str, torch.Tensor]
    uid: np.ndarray

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor columns (the uid strings are a few hundred KiB at most)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def bytes_per_sample(prompt_len: int = PROMPT_LEN, response_len: int = RESPONSE_LEN) -> int:
    """Tensor bytes one sample adds to an :class:`RLBatch`."""
    seq_len = prompt_len + response_len
    return 3 * 8 * seq_len + 8 * response_len + 2 * 4 * response_len


def make_rl_batch(size_mib: int, seed: int = 0) -> RLBatch:
    """An :class:`RLBatch` whose tensor columns total ``size_mib`` MiB (rounded down)."""
    batch = max(1, size_mib * MIB // bytes_per_sample())
    seq_len = PROMPT_LEN + RESPONSE_LEN
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, 151_000, (batch, seq_len), generator=gen, dtype=torch.int64)
    tensors = {
        "input_ids": input_ids,
        "attention_mask": torch.ones(batch, seq_len, dtype=torch.int64),
        "position_ids": torch.arange(seq_len, dtype=torch.int64).repeat(batch, 1),
        "responses": input_ids[:, PROMPT_LEN:].clone(),
        "old_log_probs": -torch.rand(batch, RESPONSE_LEN, generator=gen) * 5.0,
        "advantages": torch.randn(batch, RESPONSE_LEN, generator=gen),
    }
    group = 8  # samples per prompt share a uid
    uid = np.array([str(uuid.UUID(int=i // group)) for i in range(batch)], dtype=object)
    return RLBatch(tensors=tensors, uid=uid)


# ---------------------------------------------------------------------------- the cases


def first_elements_sum(columns: dict[str, Any], uid: np.ndarray) -> float:
    """Sum of the first element of every column, plus the length of the first uid.

    This is the consumer: it forces each received column to be readable memory.
    """
    total = 0.0
    for column in columns.values():
        flat = column.reshape(-1)
        total += float(flat[0])
    return total + len(uid[0])


def build_numpy_dict(batch: RLBatch) -> dict[str, np.ndarray]:
    """The reference payload: the same bytes as a plain dict of numpy arrays."""
    payload = {key: tensor.numpy() for key, tensor in batch.tensors.items()}
    payload["uid"] = batch.uid
    return payload


def touch_numpy_dict(payload: dict[str, np.ndarray]) -> float:
    """Consumer for :func:`build_numpy_dict` payloads."""
    columns = {key: value for key, value in payload.items() if key != "uid"}
    return first_elements_sum(columns, payload["uid"])


def build_hf_dataproto(batch: RLBatch) -> Any:
    """The batch as an ``hf_protocol.DataProto``."""
    from hf_protocol import DataProto

    return DataProto.from_dict(
        tensors=batch.tensors, non_tensors={"uid": batch.uid}, meta_info={"global_step": 1}
    )


def build_verl_dataproto(batch: RLBatch) -> Any:
    """The batch as a ``verl.protocol.DataProto``."""
    from verl.protocol import DataProto

    return DataProto.from_dict(
        tensors=batch.tensors, non_tensors={"uid": batch.uid}, meta_info={"global_step": 1}
    )


def touch_dataproto(data: Any) -> float:
    """Consumer for either DataProto (both have ``batch`` and ``non_tensor_batch``)."""
    columns = dict(data.batch.items())  # iterating a TensorDict walks rows, not keys
    return first_elements_sum(columns, data.non_tensor_batch["uid"])


@dataclass(frozen=True)
class Case:
    """One way of shipping an :class:`RLBatch` through the object store."""

    label: str
    """Row label in the table."""
    build: Callable[[RLBatch], Any]
    """Makes the object handed to ``ray.put`` (not timed)."""
    touch: Callable[[Any], float]
    """The consumer run on the ``ray.get`` result (timed)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set while the case runs (serialisation switches)."""
    needs: str | None = None
    """Module that must import for the case to run; the case is skipped otherwise."""


REFERENCE = "numpy dict (reference)"
HF_PROTOCOL = "hf-protocol DataProto"
CASES: dict[str, Case] = {
    "numpy": Case(REFERENCE, build_numpy_dict, touch_numpy_dict),
    "hf": Case(HF_PROTOCOL, build_hf_dataproto, touch_dataproto),
    "hf-copy": Case(
        "hf-protocol, HF_PROTOCOL_COPY_ON_RECEIVE=1",
        build_hf_dataproto,
        touch_dataproto,
        env={"HF_PROTOCOL_COPY_ON_RECEIVE": "1"},
    ),
    "verl": Case(
        "verl DataProto (torch.save, default)",
        build_verl_dataproto,
        touch_dataproto,
        needs="verl.protocol",
    ),
    "verl-numpy": Case(
        "verl DataProto, VERL_DATAPROTO_SERIALIZATION_METHOD=numpy",
        build_verl_dataproto,
        touch_dataproto,
        env={"VERL_DATAPROTO_SERIALIZATION_METHOD": "numpy"},
        needs="verl.protocol",
    ),
}


# ---------------------------------------------------------------------------- measuring


@dataclass
class Result:
    """Medians of the timed round trips of one case at one size."""

    size_mib: int
    label: str
    nbytes: int
    put_s: float
    get_s: float
    round_trip_s: float

    @property
    def gb_per_s(self) -> float:
        """Payload bytes over the median round trip, in decimal GB/s."""
        return self.nbytes / self.round_trip_s / GB


def round_trip(ray: ModuleType, payload: Any, touch: Callable[[Any], float]) -> tuple[float, ...]:
    """One ``put``, one ``get`` and the consumer: ``(put_s, get_s, checksum)``."""
    start = time.perf_counter()
    ref = ray.put(payload)
    put_done = time.perf_counter()
    received = ray.get(ref)
    checksum = touch(received)
    get_done = time.perf_counter()
    # Drop the result and the reference so the store can free the object.
    del received, ref
    gc.collect()
    return put_done - start, get_done - put_done, checksum


def checked_round_trip(
    ray: ModuleType, case: Case, payload: Any, expected: float
) -> tuple[float, float]:
    """:func:`round_trip` under the case's environment; raises if the data came back wrong."""
    with scoped_env(case.env):
        put_s, get_s, checksum = round_trip(ray, payload, case.touch)
    if checksum != expected:
        raise RuntimeError(
            f"{case.label} returned different data: checksum {checksum} != {expected}"
        )
    return put_s, get_s


def summarise(case: Case, size_mib: int, nbytes: int, times: list[tuple[float, float]]) -> Result:
    """Medians of put, get and their sum over the timed round trips."""
    return Result(
        size_mib=size_mib,
        label=case.label,
        nbytes=nbytes,
        put_s=statistics.median(t[0] for t in times),
        get_s=statistics.median(t[1] for t in times),
        round_trip_s=statistics.median(t[0] + t[1] for t in times),
    )


def measure_size(ray: ModuleType, cases: list[Case], size_mib: int, repeats: int) -> list[Result]:
    """Time every case at one batch size: one warm-up round, then ``repeats`` rounds.

    Each round runs every case once, so drift in the machine's state (other
    processes, memory pressure) spreads over all cases instead of favouring one.
    """
    batch = make_rl_batch(size_mib)
    expected = touch_numpy_dict(build_numpy_dict(batch))
    payloads = []
    for case in cases:
        with scoped_env(case.env):
            payloads.append(case.build(batch))
    times: list[list[tuple[float, float]]] = [[] for _ in cases]
    for round_index in range(repeats + 1):
        for case, payload, case_times in zip(cases, payloads, times, strict=True):
            case_times.append(checked_round_trip(ray, case, payload, expected))
        label = "warm-up" if round_index == 0 else f"round {round_index}/{repeats}"
        print(f"  {size_mib} MiB {label} done", file=sys.stderr, flush=True)
    return [
        summarise(case, size_mib, batch.nbytes, case_times[1:])
        for case, case_times in zip(cases, times, strict=True)
    ]


# ---------------------------------------------------------------------------- reporting


def reference_times(results: list[Result]) -> dict[int, float]:
    """Median round trip of the numpy reference at each size."""
    return {r.size_mib: r.round_trip_s for r in results if r.label == REFERENCE}


def markdown_table(results: list[Result]) -> str:
    """The results as a markdown table, one row per (size, case)."""
    reference = reference_times(results)
    lines = [
        "| size | case | put (ms) | get + touch (ms) | round trip (ms) | GB/s | vs numpy |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = reference[r.size_mib] / r.round_trip_s if r.size_mib in reference else None
        ratio_text = f"{ratio:.2f}x" if ratio is not None else "-"
        lines.append(
            f"| {r.size_mib} MiB | {r.label} | {r.put_s * 1e3:.1f} | {r.get_s * 1e3:.1f} | "
            f"{r.round_trip_s * 1e3:.1f} | {r.gb_per_s:.2f} | {ratio_text} |"
        )
    return "\n".join(lines)


def target_summary(results: list[Result]) -> str:
    """One line per size: hf-protocol's ratio to the reference against the target."""
    reference = reference_times(results)
    parts = []
    for r in results:
        if r.label == HF_PROTOCOL and r.size_mib in reference:
            ratio = reference[r.size_mib] / r.round_trip_s
            verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
            parts.append(f"{r.size_mib} MiB {ratio:.2f}x ({verdict})")
    return f"hf-protocol vs target {TARGET_RATIO}x of numpy: " + ", ".join(parts)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[64, 256, 1024],
        help="batch sizes in MiB (default: 64 256 1024)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=7,
        help="timed rounds, each running every case once, after one warm-up round (default: 7)",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=list(CASES),
        default=list(CASES),
        help="cases to run (default: all)",
    )
    parser.add_argument(
        "--object-store-gb",
        type=float,
        default=6.0,
        help="Ray object store size in GB (default: 6)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="markdown file whose generated section to append or replace",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if "numpy" not in args.cases:
        parser.error("--cases must include 'numpy': every ratio is taken against it")
    return args


def runnable_cases(names: list[str]) -> tuple[list[Case], list[str]]:
    """The cases that can run here, and a note for each one that cannot."""
    cases, notes = [], []
    for name in names:
        case = CASES[name]
        problem = import_problem(case.needs)
        if problem is None:
            cases.append(case)
        else:
            notes.append(
                f"skipped {case.label}: cannot import {case.needs} ({problem}); "
                f"run tools/bench/setup_verl_venv.sh and use its python"
            )
    return cases, notes


def main(argv: list[str] | None = None) -> int:
    """Run every case at every size, print the table, optionally write the docs section."""
    keep_ray_local()
    args = parse_args(argv)
    cases, notes = runnable_cases(args.cases)
    for note in notes:
        print(note, file=sys.stderr)
    ray = start_ray(args.object_store_gb)
    results: list[Result] = []
    try:
        prime_object_store(ray, args.object_store_gb)
        for size_mib in args.sizes:
            print(f"{size_mib} MiB: {len(cases)} cases", file=sys.stderr, flush=True)
            for result in measure_size(ray, cases, size_mib, args.repeats):
                results.append(result)
                print(
                    f"  {size_mib} MiB {result.label}: {result.round_trip_s * 1e3:.1f} ms, "
                    f"{result.gb_per_s:.2f} GB/s",
                    file=sys.stderr,
                    flush=True,
                )
        machine = machine_line(["torch", "ray", "numpy", "tensordict", "verl"])
    finally:
        ray.shutdown()
    summary = target_summary(results)
    body = "\n".join(
        [
            f"Measured on {machine}; medians of {args.repeats} rounds after one warm-up round.",
            "",
            markdown_table(results),
            "",
            summary + ".",
            *[f"\n{note}." for note in notes],
        ]
    )
    print(body)
    if args.output is not None:
        write_section(args.output, SECTION_KEY, SECTION_TITLE, body)
        print(f"wrote results to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
