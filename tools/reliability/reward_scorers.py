"""The scoring functions of the reward fault cases (faults_rewards.py).

A module of their own with no heavy import: a scoring process imports the module of each
function it runs (they are pickled by name), so a process that gets its first sample during a
case pays milliseconds, not the seconds of importing torch, and the table times only the fault.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def exact_score(solution: str, ground_truth: Any) -> float:
    """1.0 for the exact answer."""
    return float(solution == ground_truth)


def pid_then_sleep_score(solution: str, ground_truth: Any, extra_info: Mapping[str, Any]) -> float:
    """Writes its process id where the case can read it, then works for a long time."""
    Path(extra_info["pid_file"]).write_text(str(os.getpid()))
    time.sleep(30)
    return 1.0


def hog_score(solution: str, ground_truth: Any) -> float:
    """Allocates 8 GiB, past the case's 2 GiB cap."""
    return float(len(bytearray(8 * 1024**3)))


def spin_score(solution: str, ground_truth: Any) -> float:
    """Burns CPU inside C code, where the alarm cannot interrupt it (as a stuck native
    parser does): a key derivation of two billion rounds."""
    return float(len(hashlib.pbkdf2_hmac("sha256", b"x", b"salt", 2**31 - 1)))


def raising_score(solution: str, ground_truth: Any) -> float:
    """A parser that fails on every answer."""
    raise ValueError(f"cannot parse {solution!r}")


def hang_score(solution: str, ground_truth: Any) -> float:
    """Never returns (a parser that waits on something that never comes)."""
    time.sleep(3600)
    return 0.0
