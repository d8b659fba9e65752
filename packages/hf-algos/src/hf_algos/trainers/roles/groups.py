"""Worker groups of a trainer, placed as the config says, and their actor -> rollout weight link.

Two placements (``trainer.placement``):

* ``hybrid``: actor, rollout, reference (and critic) fused into one process per slot with
  :func:`hf_controller.create_colocated_worker_cls_fused`; the rollout reads the actor's
  ``iter_full_params()`` in the same process, so a weight sync moves no data between
  processes.
* ``separate``: the training roles share one pool, the rollout has its own; actor rank 0
  and the rollout ranks share a :class:`~hf_rollout.WeightChannel` (a torch.distributed
  group of its own), and a sync streams the weights through it in buckets. The driver only
  issues the calls: no tensor passes through it or the object store.

Either way the pairing is a :class:`hf_rollout.WeightLink` (:attr:`RoleGroups.weights`); the
actor's workers are :class:`~hf_algos.trainers.roles.sync_actor.SyncActorWorker`.

``trainer.backend=local`` runs the (single) fused worker inside the driver process.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

from hf_algos.checkpoint import Checkpointable
from hf_algos.config.trainer import TrainerSection
from hf_algos.trainers.roles.placement import require_gpus, take_early_pool, worker_pool
from hf_algos.trainers.roles.protocols import (
    ActorGroup,
    CriticGroup,
    CurrentGroup,
    ReferenceGroup,
    RewardModelGroup,
    RolloutGroup,
    as_group,
)
from hf_algos.trainers.roles.self_healing import RolloutReplacement, SelfHealingRollout
from hf_controller import (
    CallTiming,
    RayClassWithInitArgs,
    RayResourcePool,
    create_colocated_worker_cls_fused,
    dead_workers,
    ensure_ray,
    make_worker_group,
)
from hf_rollout import WeightLink

logger = logging.getLogger(__name__)

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
        weight_bucket_bytes: int = 64 << 20,
        weight_device: str = "cpu",
        new_rollout: Callable[[], tuple[RolloutGroup, list[object]]] | None = None,
        rollout_owned: list[object] | None = None,
        respawn: Callable[[], RoleGroups] | None = None,
        max_replacements: int = 0,
    ) -> None:
        self._respawn = respawn
        """Starts the same layout again in new processes (:meth:`rebuild`)."""
        self.recovery = RolloutReplacement(self, max_replacements)
        """The separate placement's rollout recovery (:mod:`~hf_algos.trainers.roles.self_healing`),
        at most ``max_replacements`` times in the run, restarts included."""
        self._past_timings: list[CallTiming] = []  # of the groups a rebuild ended
        self._healing_rollout = SelfHealingRollout(self)  # roles.rollout, separate placement
        self._take(
            actor, fused, rollout, ref, critic, reward_model, owned, weight_bucket_bytes,
            weight_device, new_rollout, rollout_owned,
        )  # fmt: skip

    def _take(
        self,
        actor: ActorGroup,
        fused: bool,
        rollout: RolloutGroup | None,
        ref: ReferenceGroup | None,
        critic: CriticGroup | None,
        reward_model: RewardModelGroup | None,
        owned: list[object] | None,
        weight_bucket_bytes: int,
        weight_device: str,
        new_rollout: Callable[[], tuple[RolloutGroup, list[object]]] | None,
        rollout_owned: list[object] | None,
    ) -> None:
        """Hold these groups (at construction, and the new ones of :meth:`rebuild`)."""
        self.actor = actor
        """Group with ``compute_log_prob``, ``update_actor``, checkpoints, ``send_weights``."""
        self.fused = fused
        """Rollout shares the actor's processes (hybrid placement)."""
        self.owned: list[object] = owned if owned is not None else []
        """Top-level groups and pools to shut down at the end."""
        self._rollout = rollout
        self._ref = ref
        self._critic = critic
        self._reward_model = reward_model
        self._bucket_bytes, self._weight_device = weight_bucket_bytes, weight_device
        self._weights = (
            None
            if rollout is None
            else WeightLink(actor, rollout, fused, weight_bucket_bytes, weight_device)
        )  # separate placement: bucket size of the channel and where its buffers live
        self._new_rollout = new_rollout
        """Separate placement: starts a rollout group (and what it owns) in a new pool."""
        self._rollout_owned: list[object] = rollout_owned or []
        """The items of :attr:`owned` that belong to the rollout group (group, pool)."""

    @property
    def rollout(self) -> RolloutGroup:
        """Group with ``generate_sequences`` and ``update_weights``: in the separate
        placement a :class:`~hf_algos.trainers.roles.self_healing.SelfHealingRollout`, whose
        calls survive a rollout worker's death (:attr:`recovery`)."""
        group = _present("rollout", self._rollout)
        return group if self.fused else cast(RolloutGroup, self._healing_rollout)

    @property
    def live_rollout(self) -> RolloutGroup:
        """The rollout group of the moment itself (a replacement puts a new one here)."""
        return _present("rollout", self._rollout)

    @property
    def weights(self) -> WeightLink:
        """The actor -> rollout weight link (its channel opened by :meth:`init_models`)."""
        return _present("rollout", self._weights)

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

    def current(self, role: OptionalRole) -> Any:
        """A stand-in for ``role``'s group that calls the group of the moment: for a
        collaborator that keeps a group across :meth:`rebuild` (e.g. a reward-model scorer)."""
        _present(role, self._optional()[role])  # absent: fail here, with the setting
        return CurrentGroup(self, role)

    def has(self, role: OptionalRole) -> bool:
        """Whether this run built ``role``."""
        return self._optional()[role] is not None

    def _optional(
        self,
    ) -> dict[str, ReferenceGroup | CriticGroup | RewardModelGroup | RolloutGroup | None]:
        return {
            "ref": self._ref,
            "critic": self._critic,
            "reward_model": self._reward_model,
            "rollout": self._rollout,
        }

    def init_models(self) -> None:
        """Build every role's model (collective per group); the actor first. In the
        ``separate`` placement, then open the actor -> rollout weight channel."""
        self.actor.init_model()
        for group in self._optional().values():  # ref, critic, reward model, then rollout
            if group is not None and group is not self.actor:  # a LoRA actor is its own ref
                group.init_model()
        if self._weights is not None:
            self._weights.open()  # the separate placement's channel (nothing when fused)

    def sync_weights(self, version: int | None = None) -> None:
        """Load the actor's current weights into the rollout engine(s) as policy ``version``
        (default: one more than the last push); the rollout reports it with its samples.

        ``hybrid``: in process. ``separate``: the actor streams them over the weight channel
        while the rollout loads them; the driver only waits for both (it receives ``None``s).
        """
        if self._weights is None or not self._weights.ready:
            raise RuntimeError(
                "RoleGroups.sync_weights: the weight channel is not open; call init_models() "
                "first (it opens the channel in the separate placement)"
            )
        if self.fused:
            self._weights.push(version)
        else:  # a failed push or a dead rollout worker is recovered (self_healing)
            version = self._weights.version + 1 if version is None else version
            self.recovery.run(lambda: self.weights.push(version), version)

    def build(self, version: int = 0) -> None:
        """Build every model (:meth:`init_models`), then load the actor's weights into the
        rollout as policy ``version`` and, in the hybrid placement, put it to sleep (the
        steady state between steps). At start-up and in :meth:`rebuild`."""
        self.init_models()
        if self._rollout is None:
            return
        self.sync_weights(version)
        if self.fused:
            self.live_rollout.sleep()

    def rebuild(self, version: int = 0) -> None:
        """End every group and start the same layout in new processes, built as
        :meth:`build` builds (after a worker died: the trainer's restart). This object stays
        the run's groups: whoever holds it calls the new ones."""
        if self._respawn is None:
            raise RuntimeError(
                "RoleGroups.rebuild: these groups were not made by build_role_groups"
            )
        self._past_timings.extend(self._current_timings())
        self.shutdown()
        fresh = self._respawn()
        self._take(
            fresh.actor, fresh.fused, fresh._rollout, fresh._ref, fresh._critic,
            fresh._reward_model, fresh.owned, fresh._bucket_bytes, fresh._weight_device,
            fresh._new_rollout, fresh._rollout_owned,
        )  # fmt: skip
        self.build(version)

    def checkpointed(self) -> dict[str, Checkpointable]:
        """The groups that save their shards with a checkpoint: the actor, and the critic
        when the run has one."""
        saved: dict[str, Checkpointable] = {"actor": self.actor}
        if self._critic is not None:
            saved["critic"] = self._critic
        return saved

    def restored(self, step: int) -> None:
        """After a checkpoint of ``step`` was loaded: the rollout gets the restored weights."""
        if self._rollout is not None:
            self.sync_weights(step)

    def replace_rollout(self, version: int | None = None) -> None:
        """End the rollout group and start a new one in its place (separate placement).

        For a rollout worker that died or hangs: the actor leaves the old weight channel
        (a send in flight to it is abandoned), the old group's processes end and its pool is
        given back, and the new group builds its model, opens a new channel with the actor
        and is loaded with the actor's current weights, as policy ``version``, before this
        returns.
        """
        if self._new_rollout is None or self._rollout is None or self._weights is None:
            raise RuntimeError(
                "RoleGroups.replace_rollout: only a separate placement's rollout group can be "
                "replaced (the hybrid placement's rollout shares the actor's processes)"
            )
        try:  # its peers may be dead: best effort, the new channel is joined below
            self.actor.close_weight_channel()
        except Exception as error:
            logger.warning("leaving the old weight channel failed (%s); going on", error)
        for item in self._rollout_owned:
            self.owned.remove(item)
            _end(item)
        rollout, self._rollout_owned = self._new_rollout()
        self.owned += self._rollout_owned
        self._rollout = rollout
        old_link = self._weights
        self._weights = WeightLink(
            self.actor,
            rollout,
            False,
            old_link.bucket_bytes,
            old_link.device,
            deadline_s=old_link.deadline_s,
        )
        rollout.init_model()
        self._weights.open()
        self._weights.push(version)

    def timings(self) -> list[CallTiming]:
        """Dispatch / execute / collect timings of every call on the run's groups (each role
        view and top-level group once), for ``hf_controller.export_chrome_trace``."""
        return sorted(self._past_timings + self._current_timings(), key=lambda r: r.start)

    def _current_timings(self) -> list[CallTiming]:
        """:meth:`timings` of the groups of the moment."""
        seen: set[int] = set()
        records: list[CallTiming] = []
        for group in [self.actor, *self._optional().values(), *self.owned]:
            timer = getattr(group, "timer", None)
            if timer is None or id(timer) in seen:
                continue
            seen.add(id(timer))
            records.extend(timer.records)
        return records

    def dead_workers(self, timeout_s: float = 10.0) -> list[str]:
        """``"<group> rank <r>"`` of every worker process that has died (Ray backend).

        A collective whose peer was killed fails on the live ranks too, often before the
        dead one is reported: this tells such an error apart from a bug. A worker that does
        not answer within ``timeout_s`` (busy, not dead) is not listed.
        """
        return dead_workers(self.owned, timeout_s)

    def shutdown(self) -> None:
        """Leave the weight channel, end the worker processes, release their reservations."""
        if self._weights is not None:
            self._weights.close()
        for item in self.owned:
            _end(item)
        self.owned.clear()


def _end(item: object) -> None:
    """Shut down a group or release a pool, best effort (a dead or stuck worker ends
    regardless)."""
    kill = getattr(item, "shutdown", None) or getattr(item, "release", None)
    if kill is not None:
        with contextlib.suppress(Exception):
            kill()


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
    ref_from_actor: bool = False,
    block_until_ready: bool = True,
    max_replacements: int = 0,
) -> RoleGroups:
    """Create the groups for ``roles`` (training roles by name) and the ``rollout`` role.

    ``roles`` must hold ``actor``; it may hold ``ref``, ``critic``, ``reward_model``.
    With ``rollout=None`` (offline DPO, SFT) only the training roles are built. With
    ``ref_from_actor`` the actor group is also the reference (a LoRA actor's base model).
    ``block_until_ready=False`` (Ray backend) returns while the worker processes still
    start; the first call on a group (``init_models``) waits for them. A separate placement's
    rollout recovers from a dead worker or a failed push at most ``max_replacements`` times
    (:attr:`RoleGroups.recovery`); :meth:`RoleGroups.rebuild` starts the same layout again.
    """
    if trainer.backend == "ray":  # before any pool: the dashboard starts with Ray or never
        ensure_ray(include_dashboard=trainer.ray_dashboard)
    hybrid = trainer.placement == "hybrid" and rollout is not None
    fused_roles = dict(roles)
    if hybrid:
        assert rollout is not None
        fused_roles["rollout"] = rollout
    prefix = f"hf_{uuid.uuid4().hex[:6]}"
    pool = (take_early_pool(trainer) if trainer.backend == "ray" else None) or _pool(
        trainer, trainer.n_workers, f"{prefix}_train", trainer.gpus_per_worker
    )
    rollout_pool = None
    if rollout is not None and not hybrid:
        rollout_pool = _rollout_pool(trainer, f"{prefix}_rollout")
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
        call_timeout_s=trainer.call_timeout_s,
        block_until_ready=block_until_ready,
    )
    views = group.spawn(fused_roles)
    owned: list[Any] = [group, pool]
    rollout_group = views.get("rollout")
    new_rollout = None
    rollout_owned: list[object] = []
    if rollout is not None and not hybrid:
        rollout_group = _rollout_group(
            trainer, rollout, rollout_pool, f"{prefix}_rollout", block_until_ready
        )
        rollout_owned = [rollout_group, rollout_pool]
        owned += rollout_owned
        new_rollout = functools.partial(_replacement_rollout, trainer, rollout, prefix)
    return RoleGroups(
        weight_bucket_bytes=trainer.weight_bucket_mb << 20,
        weight_device="cuda" if trainer.use_gpu else "cpu",
        actor=as_group(views["actor"], ActorGroup),
        fused=hybrid,
        rollout=_optional_group(rollout_group, RolloutGroup),
        ref=_optional_group(views["actor"] if ref_from_actor else views.get("ref"), ReferenceGroup),
        critic=_optional_group(views.get("critic"), CriticGroup),
        reward_model=_optional_group(views.get("reward_model"), RewardModelGroup),
        owned=owned,
        new_rollout=new_rollout,
        rollout_owned=rollout_owned,
        respawn=functools.partial(build_role_groups, trainer, roles, rollout, ref_from_actor),
        max_replacements=max_replacements,
    )


def _replacement_rollout(
    trainer: TrainerSection, rollout: RayClassWithInitArgs, prefix: str
) -> tuple[RolloutGroup, list[object]]:
    """A new rollout group in a new pool, for :meth:`RoleGroups.replace_rollout`; returns
    the group and what it owns (group, pool)."""
    name = f"{prefix}_rollout_{uuid.uuid4().hex[:4]}"
    pool = _rollout_pool(trainer, name)
    group = _rollout_group(trainer, rollout, pool, name)
    return as_group(group, RolloutGroup), [group, pool]


def _rollout_pool(trainer: TrainerSection, name: str) -> RayResourcePool | None:
    """The separate placement's rollout pool: ``rollout_workers`` workers (default
    ``n_workers``) of ``rollout_gpus_per_worker`` GPUs each (default ``gpus_per_worker``)."""
    gpus = trainer.rollout_gpus_per_worker or trainer.gpus_per_worker
    return _pool(trainer, trainer.rollout_workers or trainer.n_workers, name, gpus)


def _rollout_group(
    trainer: TrainerSection,
    rollout: RayClassWithInitArgs,
    pool: RayResourcePool | None,
    name: str,
    block_until_ready: bool = True,
) -> Any:
    """The separate placement's rollout worker group on ``pool`` (the first one, or a
    replacement)."""
    return make_worker_group(
        pool,
        rollout,
        name_prefix=name,
        backend=trainer.backend,
        call_timeout_s=trainer.call_timeout_s,
        block_until_ready=block_until_ready,
    )


def _optional_group(group: object | None, protocol: Callable[..., GroupT]) -> GroupT | None:
    return None if group is None else as_group(group, protocol)


def _pool(
    trainer: TrainerSection, workers: int, name: str, gpus_per_worker: float
) -> RayResourcePool | None:
    """:func:`~hf_algos.trainers.roles.placement.worker_pool` with these arguments, or ``None``
    with the local backend (no Ray)."""
    if trainer.backend == "local":
        require_gpus(trainer.use_gpu, "local", workers, gpus_per_worker)
        return None
    return worker_pool(trainer, workers, name, gpus_per_worker)
