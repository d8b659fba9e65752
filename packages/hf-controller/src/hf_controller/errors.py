"""Errors a worker group raises, with enough context to act on them."""

from __future__ import annotations


class WorkerGroupError(RuntimeError):
    """A call on a worker group failed on one of its workers.

    Carries the group, rank, method and node, plus the worker's own traceback
    (for an exception) or what is known of the cause (for a dead process).
    """

    def __init__(
        self, group: str, rank: int, method: str, node: str, cause: str, details: str = ""
    ) -> None:
        self.group = group
        self.rank = rank
        self.method = method
        self.node = node
        self.cause = cause
        self.details = details
        message = f"{group} rank {rank} failed in {method}() on node {node}: {cause}"
        super().__init__(f"{message}\n{details}".rstrip())


class WorkerDiedError(WorkerGroupError):
    """The worker's process ended during the call (crash, ``os._exit``, OOM kill)."""


class ConfigurationError(ValueError):
    """A configuration value cannot work; the message names the value and how to fix it.

    The one config error type of HybridFlow: worker groups and resource pools raise it here,
    and hf-engines, hf-rollout and hf-algos raise it for their configs. It is a
    ``ValueError``, so ``except ValueError`` catches it too.
    """


class WorkerTimeoutError(WorkerGroupError):
    """A blocking call was still unanswered by some ranks when its deadline passed.

    ``ranks`` lists every rank that had not answered (``rank`` is the first of them),
    ``stacks`` maps each such rank to the Python stack its process was in when the
    deadline passed (collected from the worker; a short note where it could not be), and
    ``timeout_s`` is the deadline that passed. The stuck ranks keep running the call: end
    the group (``group.shutdown()``) or, if the call may still finish, wait on it again.
    """

    def __init__(
        self,
        group: str,
        ranks: list[int],
        method: str,
        nodes: dict[int, str],
        timeout_s: float,
        stacks: dict[int, str],
    ) -> None:
        self.ranks = list(ranks)
        self.stacks = dict(stacks)
        self.timeout_s = timeout_s
        first = self.ranks[0]
        cause = (
            f"no answer within the {timeout_s:g}s deadline from rank(s) {self.ranks} of "
            f"{group}; raise the deadline (@register(timeout_s=...) or the group's "
            f"call_timeout_s) if the call is just slow, else see the stacks below"
        )
        details = "\n".join(
            f"--- {group} rank {rank} (node {nodes.get(rank, 'unknown')}): current stack ---\n"
            f"{self.stacks.get(rank, '(not collected)').rstrip()}"
            for rank in self.ranks
        )
        super().__init__(group, first, method, nodes.get(first, "unknown"), cause, details)


class WaitTimeoutError(TimeoutError):
    """:func:`hf_controller.wait_all` gave up: ``timeout_s`` passed before every handle had
    finished. ``what`` names what was waited for; ``pending`` counts the unfinished ones."""

    def __init__(self, what: str, pending: int, total: int, timeout_s: float) -> None:
        self.what = what
        self.pending = pending
        self.total = total
        self.timeout_s = timeout_s
        super().__init__(
            f"waited {timeout_s:g}s for {what}: {pending} of {total} had not finished; raise "
            f"timeout_s if they are just slow, else look at what the workers are doing "
            f"(their logs, or a group call's deadline, which dumps their stacks)"
        )


def is_worker_death(error: BaseException) -> bool:
    """Whether ``error`` means a worker process died (what a restart can recover from).

    True for a group call's :class:`WorkerDiedError` and for the error a raw handle of a dead
    worker raises (Ray's ``RayActorError``, e.g. from :func:`hf_controller.wait_all`); a
    remote exception, a timeout or a driver-side error is not a death.
    """
    if isinstance(error, WorkerDiedError):
        return True
    import ray.exceptions  # here: this module stays importable without starting Ray

    return isinstance(error, ray.exceptions.RayActorError)
