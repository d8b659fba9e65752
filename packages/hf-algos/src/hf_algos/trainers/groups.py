"""What the driver calls on its worker groups and reward scorer, as typed Protocols.

A worker group gets its methods at run time: ``WorkerGroup`` binds every ``@register``-ed
method of the worker class onto the group. These Protocols write down what such a group
offers, so the driver's calls (``self.roles.actor.update_actor(batch)``) are type-checked
and "go to definition" lands here, next to the return shape of each call:

* data-parallel methods (``DataProto`` in, ``DataProto`` out) return the workers' outputs
  concatenated in rank order: one ``DataProto`` for the whole batch;
* ``ONE_TO_ALL`` methods (``init_model``, checkpoints, ...) run on every rank with the same
  arguments and return a list with one result per rank;
* non-blocking methods (the weight channel's joins and transfers) return one handle per
  rank at once; :func:`hf_controller.wait_together` waits for them.

The weight-sync methods are declared once, by :mod:`hf_rollout.weight_sync`'s
``WeightSenderGroup`` and ``WeightReceiverGroup``, which ``ActorGroup`` and ``RolloutGroup``
extend. The worker classes behind them: ``hf_engines.workers`` (actor, critic, reference,
reward model), :class:`~hf_algos.trainers.sync_actor.SyncActorWorker` (the weight channel's
sender) and :class:`hf_rollout.workers.RolloutWorker`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from hf_algos.checkpoint import Checkpointable
from hf_protocol import DataProto
from hf_rollout.weight_sync import WeightReceiverGroup, WeightSenderGroup

__all__ = [
    "ActorGroup",
    "CriticGroup",
    "EngineGroup",
    "ReferenceGroup",
    "RewardModelGroup",
    "RewardScorer",
    "RolloutGroup",
    "TrainableGroup",
    "as_group",
]


class EngineGroup(Protocol):
    """A group of ``hf_engines`` engine workers (every engine role has these)."""

    def init_model(self) -> list[None]:
        """Build the engine on every rank (collective)."""
        ...

    def offload(self) -> list[None]:
        """Move parameters and optimizer state to CPU memory, every rank."""
        ...

    def onload(self) -> list[None]:
        """Bring parameters and optimizer state back to the compute device, every rank."""
        ...


class TrainableGroup(EngineGroup, Checkpointable, Protocol):
    """An engine group that trains: it also saves, loads and exports its model."""

    def save_checkpoint(self, path: str) -> list[None]:
        """Every rank writes its part of the checkpoint under ``path`` (shared storage)."""
        ...

    def load_checkpoint(self, path: str) -> list[int]:
        """Restore ``path`` on every rank; one global step per rank."""
        ...

    def export_hf(
        self,
        path: str,
        dtype: str | None = None,
        max_shard_size: str | int = "5GB",
        adapter_only: bool = False,
    ) -> list[None]:
        """Write a Hugging Face model directory that ``from_pretrained`` loads (a LoRA run:
        the merged model, or with ``adapter_only`` the adapter alone)."""
        ...

    def global_step(self) -> list[int]:
        """Optimizer steps taken so far, one entry per rank."""
        ...


class ActorGroup(TrainableGroup, WeightSenderGroup, Protocol):
    """The policy: :class:`~hf_algos.trainers.sync_actor.SyncActorWorker` ranks (the weight
    channel's methods come from :class:`~hf_rollout.weight_sync.WeightSenderGroup`)."""

    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` ``(B, R)`` of the responses in ``data``."""
        ...

    def update_actor(self, data: DataProto) -> DataProto:
        """Policy update on ``data``; the output holds only ``meta_info["metrics"]``."""
        ...


class CriticGroup(TrainableGroup, Protocol):
    """The value model: ``hf_engines.CriticWorker`` ranks."""

    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` ``(B, R)`` of the responses in ``data``."""
        ...

    def update_critic(self, data: DataProto) -> DataProto:
        """Value update on ``data``; the output holds only ``meta_info["metrics"]``."""
        ...


class ReferenceGroup(EngineGroup, Protocol):
    """The frozen initial policy: ``hf_engines.ReferenceWorker`` ranks."""

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` ``(B, R)`` of the responses in ``data``."""
        ...


class RewardModelGroup(EngineGroup, Protocol):
    """A value-head reward model: ``hf_engines.RewardModelWorker`` ranks."""

    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` ``(B, R)``: the model's score on each row's last response token."""
        ...


class RolloutGroup(WeightReceiverGroup, Protocol):
    """Generation: :class:`hf_rollout.workers.RolloutWorker` ranks (``world_size``,
    ``wait_results`` and the weight methods come from
    :class:`~hf_rollout.weight_sync.WeightReceiverGroup`)."""

    def init_model(self) -> list[None]:
        """Build the rollout engine on every rank."""
        ...

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for ``prompts``, sampled as ``prompts.meta_info["sampling"]`` (a
        :class:`hf_rollout.SamplingConfig`) says; rows of one prompt are adjacent."""
        ...

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start ``method_name`` on every rank (a world-size list goes one entry per rank);
        one handle per rank, for :meth:`wait_results` (the async modes' generations)."""
        ...

    def sleep(self) -> list[None]:
        """Free generation memory on every rank."""
        ...

    def wake_up(self) -> list[None]:
        """Restore what :meth:`sleep` freed."""
        ...

    def shutdown(self) -> list[None]:
        """Release the engine on every rank."""
        ...


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
            f"(see hf_algos.trainers.groups.{protocol.__name__})"
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
