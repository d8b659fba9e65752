"""Waiting on non-blocking calls from the driver, without Ray in the caller's code.

A non-blocking group call (``@register(blocking=False)``, ``execute_all_async``) returns one
handle per rank: a Ray object ref on the Ray backend, the result itself on the local backend
(where the call has already run). A driver that keeps several calls in flight waits on those
handles with these functions, which accept both kinds, so it never imports Ray:

* :func:`wait_all`: the values of some handles, failing as soon as one fails;
* :func:`wait_any`: which handles have finished (the first to finish, or none yet);
* :func:`wait_together`: calls on several groups at once (a rendezvous), each failure
  raised as its group names it;
* :func:`dead_workers`: which worker processes of some groups have died.

:func:`hf_controller.is_worker_death` tells a dead worker's error from any other.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from hf_controller.errors import WaitTimeoutError

__all__ = ["ResultWaiter", "dead_workers", "wait_all", "wait_any", "wait_together"]

POLL_S = 0.5
"""How often a wait looks at its handles: a failed one surfaces within this."""


class ResultWaiter(Protocol):
    """A group whose handles :func:`wait_together` waits for (any ``WorkerGroup``)."""

    def wait_results(
        self,
        method: str,
        handles: list[Any],
        ranks: list[int] | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """Results of ``method``'s handles of ``ranks``; a failure names group and rank."""
        ...


def _is_ref(handle: Any) -> bool:
    import ray

    return isinstance(handle, ray.ObjectRef)


def wait_all(
    handles: Sequence[Any], timeout_s: float | None = None, what: str = "calls"
) -> list[Any]:
    """The values of ``handles`` (Ray object refs or local results), in order.

    A handle that fails raises at once, without waiting for the others: a remote exception
    as Ray raises it (an instance of the remote exception's own type too), a dead worker as
    Ray's actor error (:func:`hf_controller.is_worker_death` says so). After ``timeout_s``
    (``None``: no limit) raises :class:`~hf_controller.WaitTimeoutError` naming ``what``
    (e.g. ``"the rollout's generate_sequences"``) and how many had not finished. For the
    handles of one group call, the group's own ``wait_results`` names the failing rank.
    """
    import ray

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    values = {i: h for i, h in enumerate(handles) if not _is_ref(h)}
    pending: dict[Any, list[int]] = {}
    for index, handle in enumerate(handles):
        if index not in values:
            pending.setdefault(handle, []).append(index)
    total = len(pending)
    while pending:
        wait_s = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=wait_s)
        for ref in ready:
            value = ray.get(ref)  # a failure raises here, before the others finish
            for index in pending.pop(ref):
                values[index] = value
        if pending and deadline is not None and time.monotonic() >= deadline:
            assert timeout_s is not None
            raise WaitTimeoutError(what, len(pending), total, timeout_s)
    return [values[i] for i in range(len(handles))]


def wait_any(handles: Sequence[Any], timeout_s: float | None = None) -> list[Any]:
    """The ``handles`` (distinct Ray object refs, or local results) that have finished, in
    their order; waits until at least one has, or until ``timeout_s`` passes (then the list
    may be empty; ``0`` only looks). A failed handle counts as finished: fetching its value
    (e.g. with the group's ``wait_results``) raises its error."""
    refs = [h for h in handles if _is_ref(h)]
    if len(refs) == len(handles) and refs:
        import ray

        first, rest = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if not first or not rest:
            return list(first)
        done = {*first, *ray.wait(rest, num_returns=len(rest), timeout=0)[0]}
        return [h for h in refs if h in done]
    # some handles are local results, finished already: only look at the others
    done = set()
    if refs:
        import ray

        done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
    return [h for h in handles if not _is_ref(h) or h in done]


def wait_together(*calls: tuple[str, ResultWaiter, list[Any]]) -> None:
    """Wait for the handles of non-blocking calls on several groups at once.

    ``calls`` are ``(method, group, handles)``. A failure on any rank of any group
    raises at once (the group's error names group, rank, method and node) instead of after
    the peers of a collective time out. Local-backend handles are already results.
    """
    pending: dict[Any, tuple[str, ResultWaiter, int]] = {}
    for method, group, handles in calls:
        for rank, handle in enumerate(handles):
            if _is_ref(handle):
                pending[handle] = (method, group, rank)
    while pending:
        for ref in wait_any(list(pending), timeout_s=POLL_S):
            method, group, rank = pending.pop(ref)
            # the group's own waiter turns a remote error or a dead worker into a named one
            group.wait_results(method, [ref], [rank])


def dead_workers(groups: Iterable[object], timeout_s: float = 10.0) -> list[str]:
    """``"<group> rank <r>"`` of every dead worker process of ``groups`` (Ray backend; other
    objects among ``groups``, such as pools or local groups, are skipped).

    A collective whose peer was killed fails on the live ranks too, often before the
    dead one is reported: this tells such an error apart from a bug. A worker that does
    not answer within ``timeout_s`` (busy, not dead) is not listed.
    """
    import ray
    import ray.exceptions

    pings: dict[Any, str] = {}
    for item in groups:
        for rank, worker in enumerate(getattr(item, "workers", None) or []):
            if isinstance(worker, ray.actor.ActorHandle):
                name = f"{getattr(item, 'name', 'group')} rank {rank}"
                pings[worker.__ray_ready__.remote()] = name
    if not pings:
        return []
    ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=timeout_s)
    dead = []
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError:
            dead.append(pings[ref])
    return dead
