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
from dataclasses import dataclass, field
from typing import Any

import torch

from hf_algos.config.sections import TrainerSection
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


@dataclass
class RoleGroups:
    """The worker groups of one run; roles that the run does not use are ``None``."""

    actor: Any
    """Group with ``compute_log_prob``, ``update_actor``, ``save_checkpoint``, ..."""
    rollout: Any
    """Group with ``generate_sequences`` and ``update_weights``."""
    fused: bool
    """Rollout shares the actor's processes (hybrid placement)."""
    ref: Any = None
    """Group with ``compute_ref_log_prob``."""
    critic: Any = None
    """Group with ``compute_values`` and ``update_critic``."""
    reward_model: Any = None
    """Group with ``compute_rm_score``."""
    owned: list[Any] = field(default_factory=list)
    """Top-level groups and pools to shut down at the end."""

    def init_models(self) -> None:
        """Build every role's model (collective per group); the actor first."""
        for group in (self.actor, self.ref, self.critic, self.reward_model, self.rollout):
            if group is not None:
                group.init_model()

    def sync_weights(self) -> None:
        """Load the actor's current weights into the rollout engine(s)."""
        if self.fused:
            self.rollout.update_weights()  # reads the fused actor in-process, every rank
        else:
            state = self.actor.full_state_dict()[0]
            self.rollout.update_weights(state)

    def shutdown(self) -> None:
        """End the worker processes and release their reservations."""
        for item in self.owned:
            kill = getattr(item, "kill", None) or getattr(item, "release", None)
            if kill is not None:
                with contextlib.suppress(Exception):  # best effort at teardown
                    kill()
        self.owned.clear()


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
    pool = _pool(trainer, trainer.n_workers, f"{prefix}_train")
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
        rollout_pool = _pool(trainer, trainer.rollout_workers or trainer.n_workers, prefix)
        rollout_group = make_worker_group(
            rollout_pool, rollout, name_prefix=f"{prefix}_rollout", backend=trainer.backend
        )
        owned += [rollout_group, rollout_pool]
    return RoleGroups(
        actor=views["actor"],
        rollout=rollout_group,
        fused=hybrid,
        ref=views.get("ref"),
        critic=views.get("critic"),
        reward_model=views.get("reward_model"),
        owned=owned,
    )


def _pool(trainer: TrainerSection, workers: int, name: str) -> RayResourcePool | None:
    if trainer.backend == "local":
        return None
    return RayResourcePool([workers], use_gpu=trainer.use_gpu, name_prefix=name)
