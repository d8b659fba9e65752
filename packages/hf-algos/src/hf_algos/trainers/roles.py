"""Worker groups of a trainer, placed as the config says, and the actor -> rollout weight sync.

Two placements (``trainer.placement``):

* ``hybrid``: actor, rollout, reference (and critic) fused into one process per slot with
  :func:`hf_controller.create_colocated_worker_cls_fused`; the rollout reads the actor's
  ``iter_full_params()`` in the same process, so a weight sync moves no data between
  processes.
* ``separate``: the training roles share one pool, the rollout has its own; actor rank 0
  and the rollout ranks share a :class:`~hf_rollout.WeightChannel` (a torch.distributed
  group of its own), and a sync streams the weights through it in buckets. The driver only
  issues the calls: no tensor passes through it or the object store.

``trainer.backend=local`` runs the (single) fused worker inside the driver process.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from typing import Any, Literal, TypeVar

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
from hf_algos.trainers.placement import require_gpus, take_early_pool, worker_pool
from hf_controller import (
    CallTiming,
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    create_colocated_worker_cls_fused,
    ensure_ray,
    make_worker_group,
    register,
)
from hf_controller.worker import master_address
from hf_engines.workers import ActorWorker
from hf_rollout import WeightChannel
from hf_rollout.weight_channel import DEFAULT_TIMEOUT_S


class SyncActorWorker(ActorWorker):
    """An :class:`~hf_engines.workers.ActorWorker` that can also send its full weights.

    In the ``separate`` placement, rank 0 hosts a :class:`~hf_rollout.WeightChannel` that
    the rollout ranks join; :meth:`send_weights` streams the weight-sync iterator into it.
    Every rank takes part in the iteration (it is collective under FSDP); only rank 0 sends.
    """

    _weight_channel: WeightChannel | None = None

    @register(Dispatch.RANK_ZERO)
    def weight_channel_address(self) -> tuple[str, int]:
        """A ``(host, port)`` on rank 0's node for the weight channel's rendezvous."""
        return master_address()

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_channel(
        self,
        host: str,
        port: int,
        world_size: int,
        device: str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Rank 0 joins the weight channel at ``host:port`` as its sender (channel rank 0);
        the other ranks have nothing to join. Issued together with the rollout's join."""
        self.close_weight_channel()
        if self.rank == 0:
            self._weight_channel = WeightChannel.join(host, port, 0, world_size, timeout_s, device)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def send_weights(self, bucket_bytes: int, buffered: bool = False) -> None:
        """Stream ``iter_full_params()`` into the channel in buckets of ``bucket_bytes``.

        Every rank iterates (the gather is collective); rank 0 sends. Issued together with
        the rollout's ``receive_weights``. ``buffered``: rank 0 copies the weights into
        reused buffers and returns while the broadcasts run in the background
        (:meth:`~hf_rollout.WeightChannel.send_buffered`), so the actor's next call (e.g.
        ``update_actor``) need not wait for a rollout busy generating; that call cannot
        change what the rollout receives. Costs one copy of the weights on rank 0.
        """
        params = self.iter_full_params()
        if self.rank != 0:
            for _ in params:
                pass
            return
        if self._weight_channel is None:
            raise RuntimeError(
                "SyncActorWorker.send_weights: rank 0 has no weight channel; call "
                "join_weight_channel(host, port, world_size) first"
            )
        if buffered:
            self._weight_channel.send_buffered(params, bucket_bytes)
        else:
            self._weight_channel.send(params, bucket_bytes)

    @register(Dispatch.ONE_TO_ALL)
    def close_weight_channel(self) -> None:
        """Leave the weight channel, if joined."""
        if self._weight_channel is not None:
            self._weight_channel.close()
            self._weight_channel = None


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
    ) -> None:
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
        self.weight_bucket_bytes = weight_bucket_bytes
        """``separate`` placement: bucket size of the weight channel, in bytes."""
        self.weight_device = weight_device
        """``separate`` placement: where the channel's buffers live (``cuda`` uses NCCL)."""
        self._channel_open = False

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
        """Build every role's model (collective per group); the actor first. In the
        ``separate`` placement, then open the actor -> rollout weight channel."""
        self.actor.init_model()
        for group in self._optional().values():  # ref, critic, reward model, then rollout
            if group is not None and group is not self.actor:  # a LoRA actor is its own ref
                group.init_model()
        if not self.fused and self._rollout is not None:
            self._open_weight_channel(self._rollout)

    def _open_weight_channel(self, rollout: RolloutGroup) -> None:
        host, port = self.actor.weight_channel_address()
        world_size = 1 + rollout.world_size  # actor rank 0 + every rollout rank
        # A rendezvous: both joins must be in flight before either can finish.
        wait_together(
            (
                "join_weight_channel",
                self.actor,
                self.actor.join_weight_channel(host, port, world_size, self.weight_device),
            ),
            (
                "join_weight_channel",
                rollout,
                rollout.join_weight_channel(host, port, world_size, self.weight_device),
            ),
        )
        self._channel_open = True

    def sync_weights(self) -> None:
        """Load the actor's current weights into the rollout engine(s).

        ``hybrid``: in process. ``separate``: the actor streams them over the weight channel
        while the rollout loads them; the driver only waits for both (it receives ``None``s).
        """
        if self.fused:
            self.rollout.update_weights()  # reads the fused actor in-process, every rank
            return
        if not self._channel_open:
            raise RuntimeError(
                "RoleGroups.sync_weights: the weight channel is not open; call init_models() "
                "first (it opens the channel in the separate placement)"
            )
        wait_together(
            ("send_weights", self.actor, self.actor.send_weights(self.weight_bucket_bytes)),
            ("receive_weights", self.rollout, self.rollout.receive_weights()),
        )

    def timings(self) -> list[CallTiming]:
        """Dispatch / execute / collect timings of every call on the run's groups (each role
        view and top-level group once), for ``hf_controller.export_chrome_trace``."""
        seen: set[int] = set()
        records: list[CallTiming] = []
        for group in [self.actor, *self._optional().values(), *self.owned]:
            timer = getattr(group, "timer", None)
            if timer is None or id(timer) in seen:
                continue
            seen.add(id(timer))
            records.extend(timer.records)
        return sorted(records, key=lambda r: r.start)

    def dead_workers(self, timeout_s: float = 10.0) -> list[str]:
        """``"<group> rank <r>"`` of every worker process that has died (Ray backend).

        A collective whose peer was killed fails on the live ranks too, often before the
        dead one is reported: this tells such an error apart from a bug. A worker that does
        not answer within ``timeout_s`` (busy, not dead) is not listed.
        """
        import ray
        import ray.exceptions

        pings: dict[Any, str] = {}
        for item in self.owned:
            for rank, worker in enumerate(getattr(item, "workers", None) or []):
                if isinstance(worker, ray.actor.ActorHandle):
                    name = f"{getattr(item, 'name', 'group')} rank {rank}"
                    pings[worker.__ray_ready__.remote()] = name
        ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=timeout_s)
        dead = []
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                dead.append(pings[ref])
        return dead

    def shutdown(self) -> None:
        """Leave the weight channel, end the worker processes, release their reservations."""
        if self._channel_open:
            self._channel_open = False
            for group in (self.actor, self._rollout):
                with contextlib.suppress(Exception):  # best effort at teardown
                    group.close_weight_channel()  # type: ignore[union-attr]
        for item in self.owned:
            kill = getattr(item, "shutdown", None) or getattr(item, "release", None)
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
    ref_from_actor: bool = False,
    block_until_ready: bool = True,
) -> RoleGroups:
    """Create the groups for ``roles`` (training roles by name) and the ``rollout`` role.

    ``roles`` must hold ``actor``; it may hold ``ref``, ``critic``, ``reward_model``.
    With ``rollout=None`` (offline DPO, SFT) only the training roles are built. With
    ``ref_from_actor`` the actor group is also the reference (a LoRA actor's base model).
    ``block_until_ready=False`` (Ray backend) returns while the worker processes still
    start; the first call on a group (``init_models``) waits for them.
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
        call_timeout_s=trainer.call_timeout_s,
        block_until_ready=block_until_ready,
    )
    views = group.spawn(fused_roles)
    owned: list[Any] = [group, pool]
    rollout_group = views.get("rollout")
    if rollout is not None and not hybrid:
        rollout_group = make_worker_group(
            rollout_pool,
            rollout,
            name_prefix=f"{prefix}_rollout",
            backend=trainer.backend,
            call_timeout_s=trainer.call_timeout_s,
            block_until_ready=block_until_ready,
        )
        owned += [rollout_group, rollout_pool]
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
    )


def _optional_group(group: object | None, protocol: Callable[..., GroupT]) -> GroupT | None:
    return None if group is None else as_group(group, protocol)


def _pool(
    trainer: TrainerSection, workers: int, name: str, gpus_per_worker: float
) -> RayResourcePool | None:
    """:func:`~hf_algos.trainers.placement.worker_pool` with these arguments, or ``None``
    with the local backend (no Ray)."""
    if trainer.backend == "local":
        require_gpus(trainer.use_gpu, "local", workers, gpus_per_worker)
        return None
    return worker_pool(trainer, workers, name, gpus_per_worker)


def wait_together(*calls: tuple[str, object, list[Any]]) -> None:
    """Wait for the handles of non-blocking calls on several groups at once.

    ``calls`` are ``(method, group, handles)``. A failure on any rank of any group
    raises at once (the group's error names group, rank, method and node) instead of after
    the peers of a collective time out. Local-backend handles are already results.
    """
    import ray

    pending: dict[Any, tuple[str, object, int]] = {}
    for method, group, handles in calls:
        for rank, handle in enumerate(handles):
            if isinstance(handle, ray.ObjectRef):
                pending[handle] = (method, group, rank)
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.5)
        for ref in ready:
            method, group, rank = pending.pop(ref)
            # the group's own waiter turns a remote error or a dead worker into a named one
            group.wait_results(method, [ref], [rank])  # type: ignore[attr-defined]
