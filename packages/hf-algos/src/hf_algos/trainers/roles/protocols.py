"""What the driver calls on its worker groups and reward scorer, as typed Protocols.

A worker group gets its methods at run time: ``WorkerGroup`` binds every ``@register``-ed
method of the worker class onto the group. The roles' Protocols (``ActorGroup``,
``CriticGroup``, ``ReferenceGroup``, ``RewardModelGroup``, ``RolloutGroup``) say what such a
group offers, so the driver's calls (``self.roles.actor.update_actor(batch)``) are
type-checked. They are generated from the worker classes themselves
(:mod:`hf_algos.trainers.roles.protocols_generated`, by ``tools/gen_group_protocols.py``), so they
cannot drift from them: each method has its worker method's parameters and docstring, and
the return its dispatch mode gives a group call:

* data-parallel methods (``DataProto`` in, ``DataProto`` out) return the workers' outputs
  concatenated in rank order: one ``DataProto`` for the whole batch;
* ``ONE_TO_ALL`` methods (``init_model``, checkpoints, ...) run on every rank with the same
  arguments and return a list with one result per rank;
* non-blocking methods (the weight channel's joins and transfers) return one handle per
  rank at once; :func:`hf_controller.wait_together` waits for them.

The weight-sync methods are declared once, by :mod:`hf_rollout.weight_sync`'s
``WeightSenderGroup`` and ``WeightReceiverGroup``, which ``ActorGroup`` and ``RolloutGroup``
extend. Written by hand here: :class:`RewardScorer` (the driver's scorers, not a worker
group) and :func:`as_group`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from hf_algos.trainers.roles.protocols_generated import (
    ActorGroup,
    AsyncCalls,
    CriticGroup,
    ReferenceGroup,
    RewardModelGroup,
    RolloutGroup,
)
from hf_protocol import DataProto

__all__ = [
    "ActorGroup",
    "AsyncCalls",
    "CriticGroup",
    "ReferenceGroup",
    "RewardModelGroup",
    "RewardScorer",
    "RolloutGroup",
    "as_group",
]


class RewardScorer(Protocol):
    """Scores a batch: :class:`~hf_algos.rewards.RewardManager` (rule-based) or
    :class:`~hf_algos.rewards.RewardModelScorer` (a reward-model group)."""

    def score(self, batch: DataProto) -> DataProto:
        """``token_level_scores`` ``(B, R)`` (score on the last response token), to
        ``union`` into ``batch``, with ``meta_info["metrics"]``."""
        ...

    def close(self) -> None:
        """Stop the scorer's background processes or threads."""
        ...


GroupT = TypeVar("GroupT")


class CurrentGroup:
    """A stand-in for the group at ``getattr(roles, attribute)`` as it is at each call: every
    attribute is read from the group of the moment, so a holder keeps working after the
    groups are rebuilt or replaced (``RoleGroups.current``, ``SelfHealingRollout``)."""

    def __init__(self, roles: object, attribute: str) -> None:
        self._roles, self._attribute = roles, attribute

    def __getattr__(self, name: str) -> Any:
        return getattr(getattr(self._roles, self._attribute), name)


def as_group(group: object, protocol: Callable[..., GroupT]) -> GroupT:
    """``group`` typed as ``protocol`` (one of the Protocol classes above), after checking
    that it has every method the Protocol declares.

    Worker groups get their methods at run time, so the type checker cannot see that a
    ``WorkerGroup`` satisfies a Protocol; this is the one place that says so, and a role
    built from the wrong worker class fails here, naming what it lacks.
    """
    # Annotated Callable where type[GroupT] is meant: mypy refuses a Protocol class for a
    # type[T] parameter (error code type-abstract, python/mypy#4717).
    if not isinstance(protocol, type):
        raise TypeError(f"as_group needs a Protocol class, got {protocol!r}")
    missing = [name for name in _methods(protocol) if not callable(getattr(group, name, None))]
    if missing:
        name = getattr(group, "name", type(group).__name__)
        raise TypeError(
            f"worker group {name!r} cannot serve as a {protocol.__name__}: it has no "
            f"{missing} method(s); build that role from a worker class that registers them "
            f"(see hf_algos.trainers.roles.protocols.{protocol.__name__})"
        )
    return cast(GroupT, group)


def _methods(protocol: type) -> list[str]:
    """Public methods a Protocol declares, its Protocol bases included."""
    names: set[str] = set()
    for klass in protocol.__mro__:
        if Protocol not in klass.__bases__:  # object, Protocol, Generic: nothing declared
            continue
        names.update(n for n, v in vars(klass).items() if callable(v) and not n.startswith("_"))
    return sorted(names)
