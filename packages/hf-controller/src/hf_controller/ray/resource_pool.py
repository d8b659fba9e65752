"""Placement-group resource pools: where a group's workers go, reserved up front.

A :class:`RayResourcePool` reserves one placement-group bundle per worker
process: one placement group per entry of ``process_on_nodes``, packed on one
node, each entry on a different node (ranks follow entry order). Several worker
groups can share a pool (colocation): each actor takes ``1 / max_colocate_count``
of its bundle. CPU pools reserve a small CPU fraction per bundle, so a pool of 4
fits on a 2-core machine.

Who frees what (colocated groups share a pool, so no single group owns it):

* A pool owns the placement groups it reserved. It gives them back on :meth:`release`
  (explicit, idempotent), when the last worker group using it shuts down or is dropped
  (each group holds the pool while it lives), and when the pool object itself is dropped.
  A released pool reserves again on its next use. ``detached=True`` pools, and pools a
  ``detached=True`` group was placed on, are only freed by an explicit :meth:`release`:
  they are meant to outlive this driver (or at least the group's handles in it).
* A pool made by :func:`split_resource_pool` or :func:`merge_resource_pool` owns nothing:
  it keeps the pools it came from alive, and their placement groups are freed with them.
* Releasing a pool ends every actor still placed on it (Ray's rule), so release a shared
  pool only when all its groups are done; the automatic paths above wait for that.
* A driver that exits or crashes leaves nothing behind: Ray removes a job's non-detached
  placement groups with the job.
"""

from __future__ import annotations

import contextlib
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hf_controller.errors import ConfigurationError
from hf_controller.ray.cluster import (
    NodeSummary,
    cluster_nodes,
    describe_nodes,
    ensure_ray,
    pick_nodes,
)
from hf_controller.threads import threads_per_worker
from hf_controller.worker_group import ResourcePool

PLACEMENT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class BundleSlot:
    """One worker's place: a bundle of a placement group (one placement group per node)."""

    placement_group: Any
    bundle_index: int


class RayResourcePool(ResourcePool):
    """Reserved bundles for ``process_on_nodes`` worker processes, one node per entry.

    ``process_on_nodes=[4, 2]`` puts ranks 0-3 on one node and ranks 4-5 on another
    (verl semantics). Each worker's bundle is ``cpus_per_worker`` CPUs (default 1.0
    with GPUs, 0.1 without) plus, when ``use_gpu``, ``gpus_per_worker`` GPUs
    (fractional, or more than one, e.g. 2 for a tensor-parallel replica). Nothing is
    reserved until :meth:`slots` is first called; then the layout is checked against
    the cluster's alive nodes before any placement group is created.
    """

    def __init__(
        self,
        process_on_nodes: Sequence[int] | None = None,
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        detached: bool = False,
        cpus_per_worker: float | None = None,
        gpus_per_worker: float = 1.0,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or f"hf_pool_{uuid.uuid4().hex[:8]}"
        self.detached = detached
        self.cpus_per_worker = (
            cpus_per_worker if cpus_per_worker is not None else (1.0 if use_gpu else 0.1)
        )
        self.gpus_per_worker = gpus_per_worker
        if self.cpus_per_worker <= 0:
            raise ConfigurationError(
                f"cpus_per_worker must be > 0, got {self.cpus_per_worker}; "
                f"use e.g. 0.1 for light CPU workers"
            )
        if use_gpu and self.gpus_per_worker <= 0:
            raise ConfigurationError(
                f"gpus_per_worker must be > 0 when use_gpu=True, got {self.gpus_per_worker}; "
                f"use use_gpu=False for CPU-only workers"
            )
        self._slots: list[BundleSlot] | None = None
        self._users = 0  # live worker groups placed on this pool
        self._pinned = False  # a detached group is placed on it: explicit release only
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._hosts: list[Any] = []  # prestarted worker processes, one per slot, unused yet

    def bundle(self) -> dict[str, float]:
        """Resources reserved per worker process."""
        resources = {"CPU": float(self.cpus_per_worker)}
        if self.use_gpu:
            resources["GPU"] = float(self.gpus_per_worker)
        return resources

    def actor_resources(self) -> dict[str, float]:
        """``num_cpus`` / ``num_gpus`` of one actor: ``1 / max_colocate_count`` of its bundle."""
        share = {"num_cpus": self.cpus_per_worker / self.max_colocate_count}
        if self.use_gpu:
            share["num_gpus"] = self.gpus_per_worker / self.max_colocate_count
        return share

    def slots(self) -> list[BundleSlot]:
        """The bundles in rank order, reserving them on first use."""
        if self._slots is None:
            self._slots = self._reserve()
        return self._slots

    def prestart(self, preload: Sequence[str]) -> None:
        """Reserve the bundles and start one worker process on each now, importing the
        modules ``preload`` names, before the worker class is known (two-phase start,
        :mod:`hf_controller.ray.host`).

        The next worker group placed on this pool builds its workers in these processes
        (when its class can be hosted: see :func:`~hf_controller.ray.host.can_host`), so
        their imports overlap whatever the driver does meanwhile. Unused ones end with the
        pool's placement groups (:meth:`release`).
        """
        from hf_controller.ray.host import start_hosts

        if not self._hosts:
            self._hosts = start_hosts(self.slots(), self.actor_resources(), preload)

    def take_hosts(self) -> list[Any]:
        """The prestarted worker processes, in rank order, handed over once ([] if none)."""
        hosts, self._hosts = self._hosts, []
        return hosts

    def worker_threads(self) -> list[int]:
        """CPU threads of each rank's worker, in rank order
        (:func:`~hf_controller.threads.threads_per_worker`: whole cores of its bundle, or
        its share of its node's CPUs among all the bundles placed there, this pool's and
        every other reserved one's, e.g. a separate rollout pool's)."""
        from ray.util.placement_group import placement_group_table

        cpus = {node.node_id: node.cpus for node in cluster_nodes()}
        placed = bundles_per_node(placement_group_table())
        threads = []
        for slot in self.slots():
            node = node_of(slot.placement_group)
            sharing = max(len(slot.placement_group.bundle_specs), placed.get(node, 0))
            threads.append(threads_per_worker(self.cpus_per_worker, sharing, cpus.get(node, 1.0)))
        return threads

    def node_ids(self) -> list[str]:
        """The Ray node id of every placement group, in rank order (reserves on first use)."""
        groups = {id(s.placement_group): s.placement_group for s in self.slots()}
        return [node_of(group) for group in groups.values()]

    def _reserve(self) -> list[BundleSlot]:
        ensure_ray()
        names = [f"{self.name_prefix}_pg_{index}" for index in range(len(self.store))]
        existing = [
            self._existing(name, count) for name, count in zip(names, self.store, strict=True)
        ]
        taken = {i: node_of(g) for i, g in enumerate(existing) if g is not None and node_of(g)}
        need = self.bundle()
        needs = [{k: v * count for k, v in need.items()} for count in self.store]
        # Checked before anything is reserved: a layout that cannot fit fails now, not in 60s.
        targets = pick_nodes(needs, cluster_nodes(), taken)
        created: list[Any] = []
        try:
            groups = [
                self._place(name, count, target, group, created)
                for name, count, target, group in zip(
                    names, self.store, targets, existing, strict=True
                )
            ]
            self._check_distinct(names, groups)
        except BaseException:
            _remove(created)  # a half-made reservation would hold resources nobody can use
            raise
        if not self.detached and not self._pinned:
            # Frees the reservation when the pool is dropped; it holds the placement
            # groups, never the pool, so it does not keep the pool alive.
            self._finalizer = weakref.finalize(self, _remove_quietly, groups)
            self._finalizer.atexit = False  # at exit Ray frees the job's groups itself
        return [
            BundleSlot(group, i)
            for group, count in zip(groups, self.store, strict=True)
            for i in range(count)
        ]

    def _existing(self, name: str, count: int) -> Any:
        """The placement group ``name`` left by an earlier driver (None if none), checked."""
        from ray.util.placement_group import get_placement_group

        try:
            group = get_placement_group(name)
        except ValueError:
            return None
        bundles = [self.bundle() for _ in range(count)]
        if group.bundle_specs != bundles:
            raise ConfigurationError(
                f"placement group {name!r} already exists with bundles "
                f"{group.bundle_specs}, not {bundles}; use another name_prefix, or remove "
                f"it with ray.util.remove_placement_group if no group uses it any more"
            )
        return group  # a restarted driver reattaches

    def _place(
        self, name: str, count: int, target: NodeSummary, group: Any, created: list[Any]
    ) -> Any:
        import ray

        if group is None:
            group = ray.util.placement_group(
                [self.bundle() for _ in range(count)],
                strategy="STRICT_PACK",
                name=name,
                lifetime="detached" if self.detached else None,
                # Ray may still put separate STRICT_PACK groups on one node; aim each at
                # its own node, then _check_distinct verifies where it landed.
                _soft_target_node_id=target.node_id,
            )
            created.append(group)
        ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise ConfigurationError(self._timeout_message(name, count, target))
        return group

    def _timeout_message(self, name: str, count: int, target: NodeSummary) -> str:
        nodes = cluster_nodes()
        now = next((n for n in nodes if n.node_id == target.node_id), target)
        need = {k: v * count for k, v in self.bundle().items()}
        free = {"CPU": now.cpus_free, "GPU": now.gpus_free}
        short = [f"{k} (needs {v:g}, {free[k]:g} free)" for k, v in need.items() if free[k] < v]
        return (
            f"placement group {name!r} ({count} x {self.bundle()}) could not be placed within "
            f"{PLACEMENT_TIMEOUT_S:.0f}s on node {now.node_id[:8]} ({now.address}): short of "
            f"{', '.join(short) or 'nothing now (it was busy)'}. Free per node: "
            f"{describe_nodes(nodes)}. Free resources (end other jobs, pool.release() unused "
            f"pools), or use fewer processes, use_gpu=False, or a smaller cpus_per_worker / "
            f"gpus_per_worker."
        )

    @staticmethod
    def _check_distinct(names: list[str], groups: list[Any]) -> None:
        """Raise if two placement groups of the pool landed on one node."""
        seen: dict[str, str] = {}
        for name, group in zip(names, groups, strict=True):
            node = node_of(group)
            if node in seen:
                raise ConfigurationError(
                    f"placement groups {seen[node]!r} and {name!r} both landed on node "
                    f"{node[:8]}, but each process_on_nodes entry needs its own node (the "
                    f"intended node was busy). Free nodes: {describe_nodes(cluster_nodes())}. "
                    f"Free resources on the other nodes, or use fewer entries."
                )
            seen[node] = name

    def release(self) -> None:
        """Give the reserved placement groups back to Ray (ending any actor still on them).

        Idempotent; the pool reserves again on its next use. Worker groups call it for
        their pool when the last of them shuts down or is dropped.
        """
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        slots, self._slots = self._slots, None
        self._hosts = []  # they end with the placement groups
        _remove([s.placement_group for s in slots or []])

    def _keep_until_released(self) -> None:
        """Only an explicit :meth:`release` frees this pool from now on: a detached group
        placed on it must outlive its handles in this driver."""
        self._pinned = True
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def _add_user(self) -> None:
        """A worker group now lives on this pool (see the module docstring)."""
        self._users += 1

    def _remove_user(self) -> None:
        """A worker group on this pool ended; the last one to end releases the pool."""
        self._users = max(0, self._users - 1)
        if self._users == 0 and not self._pinned:
            self.release()


def bundles_per_node(table: dict[str, Any]) -> dict[str, int]:
    """Node id -> bundles of reserved (``CREATED``) placement groups on it, from Ray's
    ``placement_group_table()``."""
    counts: dict[str, int] = {}
    for info in table.values():
        if info.get("state") == "CREATED":
            for node in info.get("bundles_to_node_id", {}).values():
                counts[node] = counts.get(node, 0) + 1
    return counts


def node_of(group: Any) -> str:
    """The node id a placed STRICT_PACK group is on ('' while it is pending)."""
    from ray.util.placement_group import placement_group_table

    nodes = placement_group_table(group).get("bundles_to_node_id", {})
    return str(next(iter(nodes.values()), "") or "")


def _remove(groups: list[Any]) -> None:
    from ray.util.placement_group import remove_placement_group

    for group in {id(g): g for g in groups}.values():
        remove_placement_group(group)


def _remove_quietly(groups: list[Any]) -> None:
    """:func:`_remove` for finalizers: a no-op once Ray is shut down, and never raising."""
    import ray

    if ray.is_initialized():
        with contextlib.suppress(Exception):
            _remove(groups)


class _SlotPool(RayResourcePool):
    """A pool over already reserved bundles (result of a split or a merge).

    It owns no placement groups: it keeps ``parents`` (the pools the bundles belong to)
    alive, and they free the bundles.
    """

    def __init__(
        self, parent: RayResourcePool, slots: list[BundleSlot], parents: list[RayResourcePool]
    ) -> None:
        counts: dict[int, int] = {}
        for slot in slots:
            counts[id(slot.placement_group)] = counts.get(id(slot.placement_group), 0) + 1
        super().__init__(
            list(counts.values()),
            use_gpu=parent.use_gpu,
            name_prefix=parent.name_prefix,
            max_colocate_count=parent.max_colocate_count,
            detached=parent.detached,
            cpus_per_worker=parent.cpus_per_worker,
            gpus_per_worker=parent.gpus_per_worker,
        )
        self._slots = slots
        self._parents = parents

    def release(self) -> None:
        """Nothing to give back: the placement groups belong to the pools this one was
        split or merged from; release those (or drop them) instead."""

    def _keep_until_released(self) -> None:
        for parent in self._parents:
            parent._keep_until_released()

    def slots(self) -> list[BundleSlot]:
        """The bundles in rank order (reserved by the pools this one came from)."""
        assert self._slots is not None
        return self._slots


def split_resource_pool(
    pool: RayResourcePool, split_size: int | Sequence[int]
) -> list[RayResourcePool]:
    """Cut a pool into consecutive sub-pools of ``split_size`` processes (or the given sizes)."""
    slots = pool.slots()
    sizes = (
        [split_size] * (len(slots) // split_size)
        if isinstance(split_size, int)
        else list(split_size)
    )
    if sum(sizes) != len(slots) or any(s < 1 for s in sizes):
        raise ConfigurationError(
            f"cannot split a pool of {len(slots)} processes into parts of {split_size}; the parts "
            f"must be positive and add up to {len(slots)}"
        )
    parts: list[RayResourcePool] = []
    start = 0
    for size in sizes:
        parts.append(_SlotPool(pool, slots[start : start + size], [pool]))
        start += size
    return parts


def merge_resource_pool(first: RayResourcePool, second: RayResourcePool) -> RayResourcePool:
    """One pool holding the processes of ``first`` then ``second`` (same kind of resources)."""
    if first.bundle() != second.bundle() or first.max_colocate_count != second.max_colocate_count:
        raise ConfigurationError(
            "cannot merge pools with different bundles or max_colocate_count: "
            f"bundle {first.bundle()} vs {second.bundle()}, "
            f"max_colocate_count {first.max_colocate_count} vs {second.max_colocate_count}; "
            "build both with the same use_gpu, cpus_per_worker and gpus_per_worker"
        )
    return _SlotPool(first, first.slots() + second.slots(), [first, second])
