"""Worker groups of a trainer, placed as the config says, and the actor -> rollout weight sync.

Two placements (``trainer.placement``):

* ``hybrid``: actor, rollout, reference (and critic) fused into one process per slot with
  :func:`hf_controller.create_colocated_worker_cls_fused`; the rollout reads the actor's
  ``iter_full_params()`` in the same process, so a weight sync moves no data between
  processes.
* ``separate``: the training roles share one pool, the rollout has its own; a sync gathers
  the full state dict on actor rank 0, and the controller puts it in the object store once
  for every rollout worker to load.

``trainer.backend=local`` runs the (single) fused worker inside the driver process.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import torch

from hf_algos.config.sections import TrainerSection
from hf_algos.trainers.groups import (
    ActorGroup,
    CriticGroup,
    EngineGroup,
    ReferenceGroup,
    RewardModelGroup,
    RolloutGroup,
    as_group,
)
from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    create_colocated_worker_cls_fused,
    make_worker_group,
    register,
)
from hf_engines.workers import ActorWorker


class SyncActorWorker(ActorWorker):
    """An :class:`~hf_engines.workers.ActorWorker` that can also hand out its full weights.

    ``full_state_dict`` serves the ``separate`` placement, where the rollout lives in other
    processes: every rank takes part in gathering (the iterator is collective), rank 0
    returns the tensors.
    """

    @register(Dispatch.ONE_TO_ALL)
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """``{name: full tensor}`` (Hugging Face names) on rank 0, ``None`` on the others."""
        state = {name: tensor.detach().cpu().clone() for name, tensor in self.iter_full_params()}
        return state if self.rank == 0 else None


OptionalRole = Literal["rollout", "ref", "critic", "reward_model"]
"""A role that a run may go without."""

_ABSENT_HINTS: dict[OptionalRole, str] = {
    "rollout": "SFT and offline DPO build none (set dpo.online=true for online DPO)",
    "ref": "PPO builds one when actor.use_kl_loss or algorithm.use_kl_in_reward is set",
    "critic": "PPO builds one for an estimator that needs values (algorithm.adv_estimator=gae)",
    "reward_model": "set reward.model to score with a reward model",
}


class RoleGroups:
    """The worker groups of one run, typed by what the driver calls on them.

    ``actor`` always exists; ``rollout``, ``ref``, ``critic`` and ``reward_model`` exist
    when the run uses them. Reading an absent one raises an error naming the setting that
    builds it; :meth:`has` asks first.
    """

    def __init__(
        self,
        actor: ActorGroup,
        fused: bool,
        rollout: RolloutGroup | None = None,
        ref: ReferenceGroup | None = None,
        critic: CriticGroup | None = None,
        reward_model: RewardModelGroup | None = None,
        owned: list[object] | None = None,
    ) -> None:
        self.actor = actor
        """Group with ``compute_log_prob``, ``update_actor``, checkpoints, ``full_state_dict``."""
        self.fused = fused
        """Rollout shares the actor's processes (hybrid placement)."""
        self.owned: list[object] = owned if owned is not None else []
        """Top-level groups and pools to shut down at the end."""
        self._rollout = rollout
        self._ref = ref
        self._critic = critic
        self._reward_model = reward_model

    @property
    def rollout(self) -> RolloutGroup:
        """Group with ``generate_sequences`` and ``update_weights``."""
        return _present("rollout", self._rollout)

    @property
    def ref(self) -> ReferenceGroup:
        """Group with ``compute_ref_log_prob``."""
        return _present("ref", self._ref)

    @property
    def critic(self) -> CriticGroup:
        """Group with ``compute_values`` and ``update_critic``."""
        return _present("critic", self._critic)

    @property
    def reward_model(self) -> RewardModelGroup:
        """Group with ``compute_rm_score``."""
        return _present("reward_model", self._reward_model)

    def has(self, role: OptionalRole) -> bool:
        """Whether this run built ``role``."""
        return self._optional()[role] is not None

    def _optional(self) -> dict[str, EngineGroup | RolloutGroup | None]:
        return {
            "ref": self._ref,
            "critic": self._critic,
            "reward_model": self._reward_model,
            "rollout": self._rollout,
        }

    def init_models(self) -> None:
        """Build every role's model (collective per group); the actor first."""
        self.actor.init_model()
        for group in self._optional().values():  # ref, critic, reward model, then rollout
            if group is not None:
                group.init_model()

    def sync_weights(self) -> None:
        """Load the actor's current weights into the rollout engine(s)."""
        if self.fused:
            self.rollout.update_weights()  # reads the fused actor in-process, every rank
            return
        state = self.actor.full_state_dict()[0]
        if state is None:
            raise RuntimeError("the actor's rank 0 returned no state dict to sync")
        self.rollout.update_weights(state)

    def shutdown(self) -> None:
        """End the worker processes and release their reservations."""
        for item in self.owned:
            kill = getattr(item, "kill", None) or getattr(item, "release", None)
            if kill is not None:
                with contextlib.suppress(Exception):  # best effort at teardown
                    kill()
        self.owned.clear()


GroupT = TypeVar("GroupT")


def _present(role: OptionalRole, group: GroupT | None) -> GroupT:
    if group is None:
        raise AttributeError(
            f"this run has no {role!r} worker group: {_ABSENT_HINTS[role]}; check "
            f"roles.has({role!r}) before using it"
        )
    return group


def build_role_groups(
    trainer: TrainerSection,
    roles: dict[str, RayClassWithInitArgs],
    rollout: RayClassWithInitArgs | None,
) -> RoleGroups:
    """Create the groups for ``roles`` (training roles by name) and the ``rollout`` role.

    ``roles`` must hold ``actor``; it may hold ``ref``, ``critic``, ``reward_model``.
    With ``rollout=None`` (offline DPO, SFT) only the training roles are built.
    """
    hybrid = trainer.placement == "hybrid" and rollout is not None
    fused_roles = dict(roles)
    if hybrid:
        assert rollout is not None
        fused_roles["rollout"] = rollout
    prefix = f"hf_{uuid.uuid4().hex[:6]}"
    pool = _pool(trainer, trainer.n_workers, f"{prefix}_train", trainer.gpus_per_worker)
    rollout_pool = None
    if rollout is not None and not hybrid:
        gpus = trainer.rollout_gpus_per_worker or trainer.gpus_per_worker
        total = trainer.rollout_workers or trainer.n_workers
        rollout_pool = _pool(trainer, total, f"{prefix}_rollout", gpus)
    # Reserve every pool before any worker starts: a layout the cluster cannot hold fails
    # here, naming the short node, instead of after the first group has loaded its model.
    try:
        for reserved in (pool, rollout_pool):
            if reserved is not None:
                reserved.slots()
    except Exception:
        for reserved in (pool, rollout_pool):
            if reserved is not None:
                reserved.release()
        raise
    group = make_worker_group(
        pool,
        create_colocated_worker_cls_fused(fused_roles),  # type: ignore[arg-type]
        name_prefix=f"{prefix}_train",
        backend=trainer.backend,
    )
    views = group.spawn(fused_roles)
    owned: list[Any] = [group, pool]
    rollout_group = views.get("rollout")
    if rollout is not None and not hybrid:
        rollout_group = make_worker_group(
            rollout_pool, rollout, name_prefix=f"{prefix}_rollout", backend=trainer.backend
        )
        owned += [rollout_group, rollout_pool]
    return RoleGroups(
        actor=as_group(views["actor"], ActorGroup),
        fused=hybrid,
        rollout=_optional_group(rollout_group, RolloutGroup),
        ref=_optional_group(views.get("ref"), ReferenceGroup),
        critic=_optional_group(views.get("critic"), CriticGroup),
        reward_model=_optional_group(views.get("reward_model"), RewardModelGroup),
        owned=owned,
    )


def _optional_group(group: object | None, protocol: Callable[..., GroupT]) -> GroupT | None:
    return None if group is None else as_group(group, protocol)


def _pool(
    trainer: TrainerSection, workers: int, name: str, gpus_per_worker: float
) -> RayResourcePool | None:
    """``workers`` processes in total, ``workers / nnodes`` on each of ``nnodes`` nodes."""
    if trainer.backend == "local":
        return None
    return RayResourcePool(
        [workers // trainer.nnodes] * trainer.nnodes,
        use_gpu=trainer.use_gpu,
        name_prefix=name,
        cpus_per_worker=trainer.cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
    )
