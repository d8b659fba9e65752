"""Current Python stacks of a worker process, asked for from outside it.

A call that never returns (a deadlocked collective, an endless loop, a ``sleep``) is
explained by where the worker is stuck. Every worker process arms :mod:`faulthandler` on
:data:`STACK_SIGNAL` at start-up (:func:`enable_stack_dumps`): the signal makes the
interpreter write every thread's stack to a per-process file, from C, so it works even
while the stuck thread holds the GIL in native code, and the worker's own threads and
call order are left alone. :func:`dump_stacks` (run on the worker's node) sends the signal
and returns what was written.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import tempfile
import time
from typing import IO

STACK_SIGNAL = signal.SIGUSR2
"""The signal a worker answers with a stack dump (SIGUSR1 is taken by Ray Tune)."""
MAX_LINES = 80
"""Lines of stack kept per process: the innermost frames come first, so they are kept."""

_dump_file: IO[str] | None = None  # kept open: faulthandler writes to its descriptor


def stack_file(pid: int) -> str:
    """Where the process ``pid`` writes its stacks (a node-local temporary file)."""
    return os.path.join(tempfile.gettempdir(), "hf_controller_stacks", f"{pid}.txt")


def enable_stack_dumps() -> str:
    """Make this process write all its threads' stacks to :func:`stack_file` on
    :data:`STACK_SIGNAL`. Idempotent; returns the file's path ('' where unsupported)."""
    global _dump_file
    path = stack_file(os.getpid())
    if _dump_file is None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _dump_file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - lives with the process
            faulthandler.register(STACK_SIGNAL, file=_dump_file, all_threads=True, chain=False)
        except (OSError, AttributeError, ValueError):  # read-only tmp, or no such signal
            _dump_file = None
            return ""
    return path


def dump_stacks(pid: int, wait_s: float = 2.0) -> str:
    """The current stacks of local process ``pid`` (armed with :func:`enable_stack_dumps`).

    Sends the signal, waits up to ``wait_s`` for the dump to stop growing and returns it
    (innermost frames first, cut to :data:`MAX_LINES`), or a note saying why there is none.
    """
    path = stack_file(pid)
    try:
        start = os.path.getsize(path)
        os.kill(pid, STACK_SIGNAL)
    except FileNotFoundError:
        return f"(no stack: process {pid} did not arm stack dumps)"
    except ProcessLookupError:
        return f"(no stack: process {pid} has exited)"
    deadline = time.monotonic() + wait_s
    size = start
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = os.path.getsize(path)
        if now > start and now == size:  # written, and no longer growing
            break
        size = now
    with open(path, encoding="utf-8", errors="replace") as handle:
        handle.seek(start)
        text = handle.read()
    if not text.strip():
        return f"(no stack: process {pid} did not answer the dump signal within {wait_s:g}s)"
    lines = busy_threads(text).splitlines()
    kept = lines[:MAX_LINES]
    if len(lines) > MAX_LINES:
        kept.append(f"... {len(lines) - MAX_LINES} more lines")
    return "\n".join(kept)


_IDLE_FRAME = re.compile(r"[/\\](threading\.py|queue\.py|selectors\.py|ray[/\\]_private[/\\].*)\"")


def busy_threads(dump: str) -> str:
    """``dump`` (a faulthandler dump of all threads) without the threads that only run
    Ray's or the standard library's own loops, so the stuck thread comes first and alone.
    Keeps everything when no thread runs other code."""
    blocks = [block for block in re.split(r"\n\s*\n", dump.strip()) if block.strip()]
    busy = [
        block
        for block in blocks
        if any(
            line.strip().startswith("File") and not _IDLE_FRAME.search(line)
            for line in block.splitlines()
        )
    ]
    return "\n\n".join(busy or blocks)
