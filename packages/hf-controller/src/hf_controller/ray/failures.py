"""Waiting for a group's results without hanging on a broken worker.

The fast path is one ``ray.get`` of all results. If that has not finished after
``POLL_S`` seconds, the group polls: every finished result is fetched at once,
so an exception or a dead process on any rank surfaces within seconds even
while other ranks are still waiting (e.g. in a collective that will never
complete), instead of after the slowest rank.

With a deadline (``timeout_s``), the ranks still unanswered when it passes are reported
in a :class:`WorkerTimeoutError` together with each one's current Python stack, dumped
by the worker process itself (see :mod:`hf_controller.stacks`).
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Sequence
from typing import Any

from hf_controller.errors import WorkerDiedError, WorkerGroupError, WorkerTimeoutError
from hf_controller.stacks import dump_stacks

POLL_S = 0.5
LOG_LINES = 20
STACK_WAIT_S = 10.0
"""Longest wait for the stack dumps of a timed-out call (a dump that cannot run is noted)."""


def wait_for_results(
    group: str,
    method: str,
    refs: Sequence[Any],
    ranks: Sequence[int],
    workers: dict[int, dict[str, Any]],
    timeout_s: float | None = None,
) -> list[Any]:
    """Results of ``refs`` in order; raise :class:`WorkerGroupError` naming the failing rank.

    ``timeout_s`` (``None``: no deadline) bounds the whole wait; when it passes, raise
    :class:`WorkerTimeoutError` naming the unanswered ranks with their current stacks.
    ``workers`` holds each rank's ``_hf_process_info`` (pid, node) where known.
    """
    import ray

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        return list(ray.get(list(refs), timeout=_next_wait(deadline)))
    except ray.exceptions.GetTimeoutError:
        pass
    except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError):
        pass  # find out which rank failed below
    results: dict[int, Any] = {}
    pending = dict(zip(refs, range(len(refs)), strict=True))
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_next_wait(deadline))
        for ref in ready:
            index = pending.pop(ref)
            results[index] = _get_one(group, method, ref, ranks[index], workers)
        if pending and deadline is not None and time.monotonic() >= deadline:
            assert timeout_s is not None
            stuck = sorted(ranks[index] for index in pending.values())
            nodes = {r: str(workers.get(r, {}).get("node_ip", "unknown")) for r in stuck}
            stacks = collect_stacks({r: workers.get(r, {}) for r in stuck})
            raise WorkerTimeoutError(group, stuck, method, nodes, timeout_s, stacks)
    return [results[i] for i in range(len(refs))]


def _next_wait(deadline: float | None) -> float:
    """Seconds to block before looking again: a poll interval, never past the deadline."""
    if deadline is None:
        return POLL_S
    return max(0.0, min(POLL_S, deadline - time.monotonic()))


def collect_stacks(workers: dict[int, dict[str, Any]]) -> dict[int, str]:
    """The current Python stack of each rank's process (``workers``: rank -> process info).

    Each dump runs as a tiny task on the worker's node, so it works on any node of a
    cluster; the whole collection waits at most :data:`STACK_WAIT_S`.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    stacks: dict[int, str] = {}
    refs: dict[int, Any] = {}
    dump = ray.remote(dump_stacks)
    for rank, info in workers.items():
        if not info.get("pid") or not info.get("node_id") or not info.get("stack_file"):
            stacks[rank] = "(no stack: the worker's process info is unknown)"
            continue
        on_node = NodeAffinitySchedulingStrategy(info["node_id"], soft=False)
        refs[rank] = dump.options(num_cpus=0, scheduling_strategy=on_node).remote(info["pid"])
    if refs:
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=STACK_WAIT_S)
        for rank, ref in refs.items():
            try:
                stacks[rank] = ray.get(ref) if ref in ready else ""
            except Exception as error:  # a dump must never hide the timeout itself
                stacks[rank] = f"(no stack: the dump failed: {type(error).__name__}: {error})"
            if not stacks[rank]:
                stacks[rank] = f"(no stack: the dump did not finish within {STACK_WAIT_S:g}s)"
                ray.cancel(ref, force=True)
    return stacks


def _get_one(
    group: str, method: str, ref: Any, rank: int, workers: dict[int, dict[str, Any]]
) -> Any:
    import ray

    info = workers.get(rank, {})
    node = str(info.get("node_ip", "unknown"))
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as error:
        original = error.cause if isinstance(error.cause, BaseException) else error
        cause = f"{type(original).__name__}: {original}".splitlines()[0]
        raise WorkerGroupError(group, rank, method, node, cause, str(error)) from original
    except ray.exceptions.RayActorError as error:
        cause = _death_cause(str(error))
        logs = tail_worker_logs(info.get("pid"))
        details = f"{error}\n--- last lines of the worker's log ---\n{logs}" if logs else str(error)
        raise WorkerDiedError(group, rank, method, node, cause, details) from None


def _death_cause(message: str) -> str:
    """A one-line cause from Ray's actor-death message (which also lists *possible* causes)."""
    lowered = message.lower()
    for line in message.splitlines():
        if "ModuleNotFoundError" in line or "ImportError" in line:
            return f"the worker could not import its code ({line.strip()})"
    if "memory monitor" in lowered or "outofmemoryerror" in lowered:
        return "the worker process was killed for using too much memory (OOM)"
    marker = "exit detail:"
    if marker in lowered:
        detail = message[lowered.index(marker) + len(marker) :].strip()
        return f"the worker process died ({detail.split('. ')[0].strip()})"
    return "the worker process died during the call"


def tail_worker_logs(pid: Any, lines: int = LOG_LINES) -> str:
    """The last ``lines`` of a local worker's stdout/stderr logs, found by pid."""
    if pid is None:
        return ""
    try:
        import ray

        node: Any = ray._private.worker._global_node
        session = node.get_session_dir_path()
    except Exception:  # no local node: logs are on another machine
        return ""
    tails = []
    for path in sorted(glob.glob(os.path.join(session, "logs", f"worker-*-{pid}.*"))):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read().splitlines()[-lines:]
        except OSError:
            continue
        if text:
            tails.append(f"[{os.path.basename(path)}]\n" + "\n".join(text))
    return "\n".join(tails)
