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

import contextlib
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
PEER_GRACE_S = 1.0
"""After a rank died: how long the others get to fail (e.g. their collective) before
their stacks are dumped instead."""


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
    except (
        ray.exceptions.RayTaskError,
        ray.exceptions.RayActorError,
        ray.exceptions.UnserializableException,
    ):
        pass  # find out which rank failed below
    results: dict[int, Any] = {}
    pending = dict(zip(refs, range(len(refs)), strict=True))
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_next_wait(deadline))
        for ref in ready:
            index = pending.pop(ref)
            try:
                results[index] = _get_one(group, method, ref, ranks[index], workers)
            except WorkerDiedError as died:
                # The other ranks are often left waiting on the dead one (a collective):
                # say what became of them, so the report shows the whole group.
                others = _other_ranks(group, method, pending, ranks, workers)
                raise WorkerDiedError(
                    group, died.rank, method, died.node, died.cause, died.details + others
                ) from None
        if pending and deadline is not None and time.monotonic() >= deadline:
            assert timeout_s is not None
            stuck = sorted(ranks[index] for index in pending.values())
            nodes = {r: str(workers.get(r, {}).get("node_ip", "unknown")) for r in stuck}
            stacks = collect_stacks({r: workers.get(r, {}) for r in stuck})
            raise WorkerTimeoutError(group, stuck, method, nodes, timeout_s, stacks)
    return [results[i] for i in range(len(refs))]


def _other_ranks(
    group: str,
    method: str,
    pending: dict[Any, int],
    ranks: Sequence[int],
    workers: dict[int, dict[str, Any]],
) -> str:
    """What the still-pending ranks of a call did after one rank died: their errors (a
    collective whose peer died should fail within :data:`PEER_GRACE_S`), else their stacks."""
    import ray

    if not pending:
        return ""
    ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=PEER_GRACE_S)
    lines = []
    for ref in ready:
        rank = ranks[pending.pop(ref)]
        try:
            ray.get(ref)
            lines.append(f"{group} rank {rank}: finished the call")
        except Exception as error:  # reported, not handled
            cause = getattr(error, "cause", None)
            original = cause if isinstance(cause, BaseException) else error
            text = f"{type(original).__name__}: {original}".strip().splitlines()[0]
            lines.append(f"{group} rank {rank} failed too: {text}")
    stuck = sorted(ranks[index] for index in pending.values())
    stacks = collect_stacks({r: workers.get(r, {}) for r in stuck}, PEER_GRACE_S * 3)
    lines += [f"{group} rank {r}: still in {method}(); current stack:\n{stacks[r]}" for r in stuck]
    return "\n--- the other ranks ---\n" + "\n".join(lines)


def _next_wait(deadline: float | None) -> float:
    """Seconds to block before looking again: a poll interval, never past the deadline."""
    if deadline is None:
        return POLL_S
    return max(0.0, min(POLL_S, deadline - time.monotonic()))


def collect_stacks(
    workers: dict[int, dict[str, Any]], wait_s: float = STACK_WAIT_S
) -> dict[int, str]:
    """The current Python stack of each rank's process (``workers``: rank -> process info).

    Each dump runs as a tiny task on the worker's node, so it works on any node of a
    cluster; the whole collection waits at most ``wait_s``.
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
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=wait_s)
        for rank, ref in refs.items():
            try:
                stacks[rank] = ray.get(ref) if ref in ready else ""
            except Exception as error:  # a dump must never hide the timeout itself
                stacks[rank] = f"(no stack: the dump failed: {type(error).__name__}: {error})"
            if not stacks[rank]:
                stacks[rank] = f"(no stack: the dump did not finish within {wait_s:g}s)"
                with contextlib.suppress(Exception):
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
    except ray.exceptions.UnserializableException as error:
        cause = unpicklable_cause(error)
        raise WorkerGroupError(group, rank, method, node, cause, str(error)) from None
    except ray.exceptions.RayActorError as error:
        cause = death_cause(str(error))
        logs = tail_worker_logs(info.get("pid"))
        details = f"{error}\n--- last lines of the worker's log ---\n{logs}" if logs else str(error)
        raise WorkerDiedError(group, rank, method, node, cause, details) from None


def unpicklable_cause(error: BaseException) -> str:
    """One line for an exception a worker raised that could not be unpickled here (Ray's
    ``UnserializableException``): the original's ``Type: message`` (the last line of its
    traceback, which Ray keeps as text) and what its class needs."""
    trace = str(getattr(error, "_original_stack_trace", "") or error)
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else type(error).__name__
    return (
        f"{last} (its exception could not be unpickled in this process: the class needs a "
        "__reduce__, or an __init__ that takes only the message)"
    )


def death_cause(message: str) -> str:
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
