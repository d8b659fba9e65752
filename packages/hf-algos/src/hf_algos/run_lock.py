"""A run owns its directories: an exclusive lock on each while the run uses it.

A run locks its checkpoint directory (``trainer.checkpoint_dir``) and its log run directory
with :func:`lock_run_directory`: ``fcntl.flock`` on ``<directory>/.hybridflow.lock``, a file
that says who holds it (pid, host, start time, command). A second run on the same directory
is refused at once with :class:`RunDirectoryInUseError`, one line naming the holder, instead
of two runs writing each other's ``global_step_<k>``.

The kernel drops a ``flock`` when its process dies (``kill -9`` included), so a lock file
left by a dead run is free: the next run takes it over and says so in one line. The file is
removed when the lock is released; a run that locks a directory it already holds (the
``hybridflow`` command, then its trainer) shares the one lock.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from hf_controller import ConfigurationError

LOCK_FILE = ".hybridflow.lock"
"""Name of the lock file inside a locked directory."""


class RunDirectoryInUseError(ConfigurationError):
    """Another live run holds the lock of the directory this run wants."""


@dataclass
class RunLock:
    """A held lock on ``directory`` (release it with :meth:`release`)."""

    directory: Path
    """The locked directory."""
    fd: int
    """The open lock file carrying the ``flock``."""
    holds: int = 1
    """How many times this process locked it (released when it drops to 0)."""

    @property
    def path(self) -> Path:
        """The lock file."""
        return self.directory / LOCK_FILE

    def release(self) -> None:
        """Drop one hold; the last removes the lock file and unlocks the directory."""
        self.holds -= 1
        if self.holds > 0 or self.fd < 0:
            return
        _HELD.pop(self.directory, None)
        try:  # removed while still locked, so no other run ever locks a removed file
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self.fd)
            self.fd = -1


_HELD: dict[Path, RunLock] = {}
"""The directories this process holds, by resolved path."""


def lock_run_directory(directory: str | PathLike[str], key: str) -> RunLock:
    """Lock ``directory`` (created if missing) for this run, or refuse at once.

    ``key`` names the setting the directory comes from (``trainer.checkpoint_dir``), for
    the message. Raises :class:`RunDirectoryInUseError` naming the holder's pid, host, start
    time and command when another live process holds it. A lock file whose holder is gone
    is taken over with a one-line note on stderr.
    """
    root = Path(directory).resolve()
    held = _HELD.get(root)
    if held is not None:
        held.holds += 1
        return held
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirectoryInUseError(
                f"{key}={str(directory)!r} is in use by another run ({_describe(holder)}); "
                f"wait for it to end, or give this run its own directory (another {key}, "
                f"or another trainer.experiment_name)"
            ) from None
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder released and removed it between our open and our lock
    previous = _read_holder(fd)
    if previous:
        print(
            f"hybridflow: {key}={str(directory)!r}: taking over the lock left by a run "
            f"that is gone ({_describe(previous)})",
            file=sys.stderr,
            flush=True,
        )
    _write_holder(fd)
    lock = _HELD[root] = RunLock(root, fd)
    return lock


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open at ``fd`` (not removed and re-created)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _read_holder(fd: int) -> dict[str, object]:
    """What the lock file at ``fd`` says about its holder (empty when nothing readable)."""
    try:
        text = os.pread(fd, 65536, 0).decode("utf-8", errors="replace")
        holder = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _write_holder(fd: int) -> None:
    """Record this process as the holder: pid, host, start time, command."""
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
    }
    data = json.dumps(holder).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _describe(holder: dict[str, object]) -> str:
    """``pid 12 on host h, started 2026-01-01T10:00:00+00:00, command '...'``."""
    if not holder:
        return "no details recorded yet"
    return (
        f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, "
        f"started {holder.get('started', '?')}, command {str(holder.get('command', ''))!r}"
    )
