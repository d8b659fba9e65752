"""Resource limits a child process applies to itself: the one sandbox of HybridFlow's helpers.

Two kinds of child process run code the framework does not trust to behave: the reward's
scoring processes (``hf_algos.rewards.scoring_worker``, a user's scoring function) and the
python tool's child (``hf_rollout.multiturn._sandbox_child``, an expression a policy wrote).
Both confine themselves with these functions: die with the parent, leave Ctrl-C to it, cap
the address space (``RLIMIT_AS``) and give each call a CPU-time budget (``RLIMIT_CPU``).

Why here, in hf-controller: it is the one package both users already depend on (hf-rollout
and hf-algos each depend on hf-controller; hf-controller depends on neither), so no new
dependency edge is needed, and child-process plumbing sits with the controller's other
process helpers. The module imports the standard library only and nothing of its package, so
the python tool's child, which runs as ``python -I -S`` (no site-packages, no project on the
path), loads this very file by the path its parent passes, and a scoring process pays
nothing for it. Linux-only parts (``PR_SET_PDEATHSIG``) are skipped elsewhere.
"""

from __future__ import annotations

import ctypes
import math
import resource
import signal
import sys

__all__ = [
    "allow_cpu_seconds",
    "cap_address_space",
    "confine",
    "die_with_parent",
    "forbid_new_processes",
    "lift_cpu_limit",
]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Have the kernel ``SIGKILL`` this process when the thread that started it ends (Linux;
    a no-op elsewhere): a busy child dies with its parent, not only at its next read."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _lower_limit(kind: int, value: int, lock: bool) -> None:
    """Set ``kind``'s soft limit to ``value`` (never above the hard limit); ``lock``: the hard
    limit too, so this process cannot raise it again."""
    _, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value if lock else hard))


def cap_address_space(max_memory_mb: int, lock: bool = False) -> None:
    """Cap this process's address space (``RLIMIT_AS``) at ``max_memory_mb`` MiB: an
    allocation past it raises ``MemoryError`` where it happens. ``lock``: lower the hard limit
    as well."""
    _lower_limit(resource.RLIMIT_AS, max_memory_mb * 1024 * 1024, lock)


def forbid_new_processes() -> None:
    """No fork (``RLIMIT_NPROC`` 0; the kernel does not enforce it for root) and no core
    files (``RLIMIT_CORE`` 0), both locked."""
    _lower_limit(resource.RLIMIT_NPROC, 0, lock=True)
    _lower_limit(resource.RLIMIT_CORE, 0, lock=True)


def confine(max_memory_mb: int | None, lock: bool = False) -> None:
    """What every sandboxed child does first: die with its parent, ignore Ctrl-C (the parent
    handles it and reaps the child) and cap its address space at ``max_memory_mb`` MiB
    (``None``: no cap; ``lock``: the hard limit too)."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if max_memory_mb is not None:
        cap_address_space(max_memory_mb, lock)


def allow_cpu_seconds(seconds: float) -> None:
    """Let this process use ``seconds`` more CPU time from now on (``RLIMIT_CPU``; the limit
    counts the process's whole lifetime, so it is moved on before each call). Past it the
    kernel sends ``SIGXCPU``: fatal unless the process handles it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _lower_limit(resource.RLIMIT_CPU, math.ceil(usage.ru_utime + usage.ru_stime + seconds), False)


def lift_cpu_limit() -> None:
    """Drop the CPU-time budget of :func:`allow_cpu_seconds` (back to the hard limit), so an
    idle process is not hit by a late ``SIGXCPU``."""
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
