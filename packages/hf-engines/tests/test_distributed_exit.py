"""A worker's process group ends before its interpreter does (issue 32, item 3).

A rank that reached interpreter exit with its gloo group alive while a peer still held
it could abort in C++ ("terminate called without an active exception", exit code -6).
``init_distributed`` registers ``shutdown_distributed`` with ``atexit``: each rank ends
its group, and rank 0 (the rendezvous store's host) waits for the others to be done with
the store before it goes.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from hf_engines.testing import launch_ranks
from hf_engines.workers.distributed import shutdown_distributed

SCRIPT = Path(__file__).with_name("exit_scenarios.py")


def _exit_record(out: Path, rank: int) -> tuple[bool, float]:
    """Whether rank ``rank``'s group was still up when its last exit hook ran, and when."""
    up, when = (out / f"rank{rank}.txt").read_text().split()
    return up == "1", float(when)


def test_ranks_end_their_group_at_exit_and_rank_0_leaves_last(tmp_path: Path) -> None:
    outputs = launch_ranks(SCRIPT, 2, [str(tmp_path)], timeout=120)  # both must exit 0
    assert not any("no exit handshake" in output for output in outputs)
    rank0_up, rank0_exit = _exit_record(tmp_path, 0)
    rank1_up, _ = _exit_record(tmp_path, 1)
    assert not rank0_up and not rank1_up  # shutdown_distributed ran on both ranks
    # rank 0 got to exit first, yet waited for rank 1 to be done with its store
    assert rank0_exit >= float((tmp_path / "rank1.left").read_text())


def test_shutdown_without_a_group_is_a_no_op() -> None:
    assert not dist.is_initialized()
    assert shutdown_distributed() is True
