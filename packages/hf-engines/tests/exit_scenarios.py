"""A 2-rank job run by test_distributed_exit.py (``launch_ranks``), not collected.

Usage: ``python exit_scenarios.py OUT_DIR``. Each rank starts its group the way a worker
does (``init_distributed``), runs one collective and returns from ``main`` without ending
the group: rank 1 lingers first, so rank 0 (the store's host) reaches interpreter exit
first. A hook registered before the group (so ``atexit`` runs it after the library's own)
writes ``OUT_DIR/rank<r>.txt``: whether the group was still up at exit, and when.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hf_engines.testing import join_launched_group

LINGER_S = 1.0
"""How long rank 1 stays after its collective (rank 0 has long reached exit by then)."""


def record_exit(out: Path, rank: int) -> None:
    """Write ``<group still up> <time.time()> `` for this rank at interpreter exit."""
    (out / f"rank{rank}.txt").write_text(f"{int(dist.is_initialized())} {time.time()!r}")


def main() -> None:
    """Join the group, all-reduce once, let rank 1 linger, then leave without ending it."""
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    atexit.register(record_exit, out, rank)
    join_launched_group()
    total = torch.ones(1)
    dist.all_reduce(total)
    assert int(total) == dist.get_world_size()
    if rank == 1:
        time.sleep(LINGER_S)
        (out / "rank1.left").write_text(repr(time.time()))


if __name__ == "__main__":
    main()
