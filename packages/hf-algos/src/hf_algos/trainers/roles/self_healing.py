"""A self-healing rollout group: a rollout worker that dies or misses its deadline is replaced.

In the ``separate`` placement (and so in every async mode) the rollout has processes of its
own. When one of them dies during a call (SIGKILL, OOM, a crashed engine:
:class:`~hf_controller.WorkerDiedError`) or does not answer within its deadline
(:class:`~hf_controller.WorkerTimeoutError`), :class:`RolloutReplacement` ends that rollout
group and starts a new one (:meth:`~hf_algos.trainers.roles.groups.RoleGroups.replace_rollout`:
new processes, the model built, a new weight channel, the actor's current weights loaded).
The caller then generates again every prompt whose samples it had not received: samples
already collected are kept, nothing is trained twice and no prompt is skipped.

A weight push that failed while every process lives (a push cut off by its deadline under
load, a bucket that arrived corrupted) leaves the rollout on its last complete version and
the channel broken (:class:`~hf_rollout.WeightPushError`,
:class:`~hf_rollout.WeightIntegrityError`). The group needs no replacing: the channel is
reopened and the actor's current weights pushed again (:meth:`RolloutReplacement.repush`).

``rollout.max_replacements`` bounds the recoveries of a run, replacements and re-pushes
together; past it the worker's own error ends the run, as without replacement (with a note
saying the bound was reached). A worker that raised any other exception (a bug, bad input)
is never replaced. The metrics say what happened: ``rollout/replaced`` (this step),
``rollout/replaced_total``, ``rollout/repushed`` and ``rollout/repushed_total``.

Recovery is a property of the group a call goes to: in the separate placement
``RoleGroups.rollout`` is a :class:`SelfHealingRollout`, the same calls as the rollout group
(:class:`~hf_algos.trainers.roles.protocols.RolloutGroup`), and ``RoleGroups.sync_weights``
pushes through the same recovery; the trainer's step calls them as it would call any group.
The async pipeline, which keeps calls in flight, asks :meth:`RolloutReplacement.replace`
itself, so that it can issue its unfinished generations again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, TypeVar

from hf_algos.trainers.roles.protocols import CurrentGroup
from hf_controller import WorkerDiedError, WorkerGroupError, WorkerTimeoutError
from hf_protocol import DataProto
from hf_rollout import WeightIntegrityError, WeightPushError

if TYPE_CHECKING:
    from hf_algos.trainers.roles.groups import RoleGroups

__all__ = ["RolloutReplacement", "SelfHealingRollout"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
Cure = Literal["replace", "repush"]
CURE_WORDS: dict[Cure, tuple[str, str]] = {
    "replace": ("rollout worker failed", "replacing the rollout group"),
    "repush": ("weight push failed", "reopening the weight channel and pushing again"),
}
"""What the warning of each cure says: what failed, what is done."""

REPLACEABLE = (WorkerDiedError, WorkerTimeoutError)
"""The failures a new rollout group cures: a dead process, or one that stopped answering."""

PUSH_FAILURES = (WeightPushError, WeightIntegrityError)
"""The weight channel's failures a new push cures: the rollout keeps its last complete
version, and nothing of the failed push was loaded."""
PUSH_METHODS = ("send_weights", "receive_weights")
"""The two sides of a push (``WeightLink.start_push``)."""

DEAD_CHECK_S = 5.0
"""How long a worker may take to answer the liveness check before it counts as busy."""


class RolloutReplacement:
    """Replaces the rollout group of ``roles`` after a rollout worker failure, or pushes the
    weights again after a failed push, at most ``max_replacements`` times in a run together
    (see the module docstring)."""

    def __init__(self, roles: RoleGroups, max_replacements: int) -> None:
        self._roles = roles
        self.max_replacements = max_replacements
        self.total = 0
        """Replacements so far in this run."""
        self._since_metrics = 0
        self.repushes = 0
        """Re-pushes so far in this run (a failed push, every process alive)."""
        self._repushes_since_metrics = 0
        self.seconds = 0.0
        """Time spent recovering so far (new processes, model, channel, weights)."""

    def cure(self, error: BaseException) -> Cure | None:
        """What cures ``error`` in a separate placement: ``"replace"`` for a rollout worker
        that died or missed its deadline, or a peer of a rollout worker that is dead (the
        actor's weight send may report before the rollout does); ``"repush"`` for a weight
        push that failed while every process lives; ``None`` for anything else."""
        roles = self._roles
        if not isinstance(error, WorkerGroupError) or roles.fused or not roles.has("rollout"):
            return None
        name = str(getattr(roles.live_rollout, "name", ""))
        if isinstance(error, REPLACEABLE) and error.group == name:
            return "replace"
        dead = roles.dead_workers(timeout_s=DEAD_CHECK_S)
        if any(worker.startswith(f"{name} rank ") for worker in dead):
            return "replace"
        return "repush" if not dead and is_failed_push(error) else None

    def replace(self, error: WorkerGroupError, version: int | None = None) -> None:
        """Cure ``error``: replace the rollout group, or reopen the weight channel and push
        again (:meth:`cure` says which); either way the rollout then holds the actor's
        current weights as policy ``version``. Re-raises ``error`` when the bound is
        reached or nothing cures it."""
        cure = self.cure(error)
        if cure is None:
            raise error
        done = self.total + self.repushes
        if done >= self.max_replacements:
            error.add_note(
                f"the rollout was already recovered {done} time(s) in this run ({self.total} "
                f"replacement(s), {self.repushes} re-push(es); rollout.max_replacements="
                f"{self.max_replacements}); raise it to recover more"
            )
            raise error
        failed, action = CURE_WORDS[cure]
        first_line = str(error).splitlines()[0]
        limit = self.max_replacements
        logger.warning(
            "%s (%s); %s (%d of at most %d)", failed, first_line, action, done + 1, limit
        )
        start = time.perf_counter()
        if cure == "repush":
            self.repush(version)
        else:
            self._roles.replace_rollout(version)
            self.total += 1
            self._since_metrics += 1
        self.seconds += time.perf_counter() - start

    def repush(self, version: int | None = None) -> None:
        """Reopen the weight channel (both sides leave the broken one and join a new one)
        and push the actor's current weights as policy ``version``; a failure of that is
        cured in turn, within the bound."""
        self.repushes += 1
        self._repushes_since_metrics += 1
        weights = self._roles.weights
        try:
            weights.reopen()
            weights.push(version)
        except WorkerGroupError as error:
            self.replace(error, version)

    def run(self, call: Callable[[], T], version: int | None = None) -> T:
        """``call()``, after a replacement again, until it succeeds or :meth:`replace` raises
        (``call`` must read the rollout group anew each time, ``roles.live_rollout``);
        ``version`` is the policy version of the actor's current weights."""
        while True:
            try:
                return call()
            except WorkerGroupError as error:
                self.replace(error, version)

    def metrics(self) -> dict[str, float]:
        """``rollout/replaced`` and ``rollout/repushed`` since the last call, and their
        ``_total`` over the run."""
        step, self._since_metrics = self._since_metrics, 0
        pushes, self._repushes_since_metrics = self._repushes_since_metrics, 0
        return {
            "rollout/replaced": float(step),
            "rollout/replaced_total": float(self.total),
            "rollout/repushed": float(pushes),
            "rollout/repushed_total": float(self.repushes),
        }


class SelfHealingRollout(CurrentGroup):
    """The separate placement's rollout group as the driver calls it: every call of the
    rollout group (:class:`~hf_algos.trainers.roles.protocols.RolloutGroup`) goes to the
    group of the moment, and ``generate_sequences`` whose worker died or hung is made again
    on a new group loaded with the actor's current weights (see the module docstring)."""

    _roles: RoleGroups

    def __init__(self, roles: RoleGroups) -> None:
        super().__init__(roles, "live_rollout")

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """The rollout's samples of ``prompts``; after a failure, from a new group."""
        roles = self._roles
        return roles.recovery.run(
            lambda: roles.live_rollout.generate_sequences(prompts), roles.weights.version
        )


def is_failed_push(error: WorkerGroupError) -> bool:
    """Whether ``error`` is one side of a weight push that failed with a
    :data:`PUSH_FAILURES` error (raised in the worker, its process alive)."""
    return error.method in PUSH_METHODS and isinstance(error.__cause__, PUSH_FAILURES)
