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
