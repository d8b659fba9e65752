"""A script that trains without ``if __name__ == "__main__":`` is stopped in the child that
re-runs it (the reward's scoring processes are ``forkserver`` children), with the fix."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import concurrent.futures
    import multiprocessing

    from hf_algos.trainers.lifecycle.trainer import refuse_in_reimported_main

    refuse_in_reimported_main()  # what Trainer.__init__ runs first; here at module level
    print("module level ran", flush=True)


    def double(x):
        return 2 * x


    if __name__ == "__main__":
        context = multiprocessing.get_context("forkserver")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            try:
                pool.submit(double, 1).result(timeout=120)
            except concurrent.futures.process.BrokenProcessPool:
                print("child refused", flush=True)
    """
)


def test_child_rerunning_the_script_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the driver itself passes the check; the child stops at it, naming the fix
    assert done.stdout.splitlines() == ["module level ran", "child refused"]
    assert 'put the training under `if __name__ == "__main__":`' in done.stderr
