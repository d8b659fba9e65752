"""all_gather_data_proto across two real gloo processes."""

import multiprocessing as mp
import queue
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from hf_protocol import DataProto, all_gather_data_proto

WORLD_SIZE = 2
TIMEOUT_S = 60


def _rank_batch(rank: int, mismatched: bool) -> DataProto:
    rows = 3 if rank == 0 else 2  # uneven on purpose
    tensors = {
        "ids": torch.arange(rows * 2).reshape(rows, 2) + 100 * rank,
        "mask": torch.ones(rows, dtype=torch.bool),
        "logp": torch.full((rows,), float(rank)).to(torch.bfloat16),
    }
    if mismatched and rank == 1:
        tensors["extra"] = torch.zeros(rows)
    return DataProto.from_dict(tensors, {"uid": [f"r{rank}-{i}" for i in range(rows)]})


def _worker(rank: int, init_file: str, mismatched: bool, results: Any) -> None:
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE
        )
        data = _rank_batch(rank, mismatched)
        try:
            out = all_gather_data_proto(data)
            results.put(
                (
                    rank,
                    "ok",
                    out.batch["ids"].tolist(),
                    out.batch["logp"].float().tolist(),
                    out.batch["mask"].tolist(),
                    out.non_tensor_batch["uid"].tolist(),
                )
            )
        except ValueError as error:
            results.put((rank, "error", str(error)))
        dist.destroy_process_group()
    except Exception:
        results.put((rank, "crash", traceback.format_exc()))


def _run(tmp_path: Path, mismatched: bool) -> dict[int, tuple]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_file = str(tmp_path / "rendezvous")
    procs = [
        ctx.Process(target=_worker, args=(r, init_file, mismatched, results))
        for r in range(WORLD_SIZE)
    ]
    for proc in procs:
        proc.start()
    collected: dict[int, tuple] = {}
    try:
        for _ in procs:
            item = results.get(timeout=TIMEOUT_S)
            collected[item[0]] = item[1:]
    except queue.Empty:
        pytest.fail(f"gloo workers did not answer within {TIMEOUT_S}s: {collected}")
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return collected


def test_all_gather_with_uneven_ranks(tmp_path: Path) -> None:
    results = _run(tmp_path, mismatched=False)
    expected_ids = (np.arange(6).reshape(3, 2)).tolist() + (
        np.arange(4).reshape(2, 2) + 100
    ).tolist()
    for rank in range(WORLD_SIZE):
        status, ids, logp, mask, uid = results[rank]
        assert status == "ok"
        assert ids == expected_ids
        assert logp == [0.0, 0.0, 0.0, 1.0, 1.0]
        assert mask == [True] * 5
        assert uid == ["r0-0", "r0-1", "r0-2", "r1-0", "r1-1"]


def test_mismatched_columns_raise_on_every_rank_instead_of_hanging(tmp_path: Path) -> None:
    results = _run(tmp_path, mismatched=True)
    for rank in range(WORLD_SIZE):
        status, message = results[rank][:2]
        assert status == "error", message
        assert "rank 1 holds columns" in message
