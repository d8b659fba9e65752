"""Waiting for a group's results without hanging on a broken worker.

The fast path is one ``ray.get`` of all results. If that has not finished after
``POLL_S`` seconds, the group polls: every finished result is fetched at once,
so an exception or a dead process on any rank surfaces within seconds even
while other ranks are still waiting (e.g. in a collective that will never
complete), instead of after the slowest rank.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import Any

from hf_controller.errors import WorkerDiedError, WorkerGroupError

POLL_S = 0.5
LOG_LINES = 20


def wait_for_results(
    group: str,
    method: str,
    refs: Sequence[Any],
    ranks: Sequence[int],
    workers: dict[int, dict[str, Any]],
) -> list[Any]:
    """Results of ``refs`` in order; raise :class:`WorkerGroupError` naming the failing rank."""
    import ray

    try:
        return list(ray.get(list(refs), timeout=POLL_S))
    except ray.exceptions.GetTimeoutError:
        pass
    except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError):
        pass  # find out which rank failed below
    results: dict[int, Any] = {}
    pending = dict(zip(refs, range(len(refs)), strict=True))
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_S)
        for ref in ready:
            index = pending.pop(ref)
            results[index] = _get_one(group, method, ref, ranks[index], workers)
    return [results[i] for i in range(len(refs))]


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
