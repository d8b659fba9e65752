"""An elastic rollout pool: a rollout worker that dies or misses its deadline is replaced.

In the ``separate`` placement (and so in every async mode) the rollout has processes of its
own. When one of them dies during a call (SIGKILL, OOM, a crashed engine:
:class:`~hf_controller.WorkerDiedError`) or does not answer within its deadline
(:class:`~hf_controller.WorkerTimeoutError`), :class:`RolloutReplacement` ends that rollout
group and starts a new one (:meth:`~hf_algos.trainers.roles.RoleGroups.replace_rollout`:
new processes, the model built, a new weight channel, the actor's current weights loaded).
The caller then generates again every prompt whose samples it had not received: samples
already collected are kept, nothing is trained twice and no prompt is skipped.

``rollout.max_replacements`` bounds the replacements of a run; past it the worker's own
error ends the run, as without replacement (with a note saying the bound was reached). A
worker that raised an exception (a bug, bad input) is never replaced: that error is
raised at once. The metrics say what happened: ``rollout/replaced`` (this step) and
``rollout/replaced_total``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from hf_algos.trainers.roles import RoleGroups
from hf_controller import WorkerDiedError, WorkerGroupError, WorkerTimeoutError

__all__ = ["RolloutReplacement"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

REPLACEABLE = (WorkerDiedError, WorkerTimeoutError)
"""The failures a new rollout group cures: a dead process, or one that stopped answering."""

DEAD_CHECK_S = 5.0
"""How long a worker may take to answer the liveness check before it counts as busy."""


class RolloutReplacement:
    """Replaces the rollout group of ``roles()`` after a rollout worker failure, at most
    ``max_replacements`` times in a run (see the module docstring)."""

    def __init__(self, roles: Callable[[], RoleGroups], max_replacements: int) -> None:
        self._roles = roles
        self.max_replacements = max_replacements
        self.total = 0
        """Replacements so far in this run."""
        self._since_metrics = 0
        self.seconds = 0.0
        """Time spent replacing so far (new processes, model, channel, weights)."""

    def applies_to(self, error: BaseException) -> bool:
        """Whether ``error`` comes from a rollout worker of a separate placement that died or
        missed its deadline (the failures a replacement cures), or from a peer of a rollout
        worker that is dead (the actor's weight send may report before the rollout does)."""
        roles = self._roles()
        if not isinstance(error, WorkerGroupError) or roles.fused or not roles.has("rollout"):
            return False
        name = str(getattr(roles.rollout, "name", ""))
        if isinstance(error, REPLACEABLE) and error.group == name:
            return True
        dead = roles.dead_workers(timeout_s=DEAD_CHECK_S)
        return any(worker.startswith(f"{name} rank ") for worker in dead)

    def replace(self, error: WorkerGroupError, version: int | None = None) -> None:
        """Replace the rollout group after ``error``, its weights the actor's current ones
        as policy ``version``; re-raises ``error`` when the bound is reached or the error is
        not one a replacement cures."""
        if not self.applies_to(error):
            raise error
        if self.total >= self.max_replacements:
            error.add_note(
                f"the rollout group was already replaced {self.total} time(s) in this run "
                f"(rollout.max_replacements={self.max_replacements}); raise it to replace more"
            )
            raise error
        logger.warning(
            "rollout worker failed (%s); replacing the rollout group (%d of at most %d)",
            str(error).splitlines()[0],
            self.total + 1,
            self.max_replacements,
        )
        start = time.perf_counter()
        self._roles().replace_rollout(version)
        self.seconds += time.perf_counter() - start
        self.total += 1
        self._since_metrics += 1

    def run(self, call: Callable[[], T], version: int | None = None) -> T:
        """``call()``, after a replacement again, until it succeeds or :meth:`replace` raises
        (``call`` must read the rollout group anew each time, e.g. ``roles.rollout``);
        ``version`` is the policy version of the actor's current weights."""
        while True:
            try:
                return call()
            except WorkerGroupError as error:
                self.replace(error, version)

    def metrics(self) -> dict[str, float]:
        """``rollout/replaced`` since the last call and ``rollout/replaced_total``."""
        step, self._since_metrics = self._since_metrics, 0
        return {"rollout/replaced": float(step), "rollout/replaced_total": float(self.total)}
