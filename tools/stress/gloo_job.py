"""A neighbouring distributed job for engine_exit_loop.sh: 2-rank gloo jobs, back to back.

Usage: ``python tools/stress/gloo_job.py SECONDS``. Each job (``launch_ranks``) all-reduces
500 times (about a second) and exits, so rendezvous ports, store connections and process exits
keep happening on the machine next to the tests. Runs jobs until SECONDS have passed.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

RANK_SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
for _ in range(500):  # the same count on both ranks (a deadline would not match up)
    dist.all_reduce(torch.ones(1024))
dist.barrier()
dist.destroy_process_group()
"""


def main() -> None:
    """Run 2-rank gloo jobs until the time given on the command line has passed."""
    from hf_engines.testing import launch_ranks

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # killed: still report
    deadline = time.monotonic() + float(sys.argv[1])
    jobs = failed = 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "rank.py"
            script.write_text(RANK_SCRIPT)
            while time.monotonic() < deadline:
                try:
                    launch_ranks(script, 2, timeout=120)
                except RuntimeError as error:
                    failed += 1
                    print(f"neighbour job failed: {str(error)[:200]}", file=sys.stderr)
                jobs += 1
    finally:
        print(f"neighbour jobs: {jobs} done, {failed} failed (pid {os.getpid()})", flush=True)


if __name__ == "__main__":
    main()
