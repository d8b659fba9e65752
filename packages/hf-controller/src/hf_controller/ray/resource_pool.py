"""Placement-group resource pools: where a group's workers go, reserved up front.

A :class:`RayResourcePool` reserves one placement-group bundle per worker
process (one placement group per node, packed). Several worker groups can share
a pool (colocation): each actor takes ``1 / max_colocate_count`` of its bundle.
CPU pools reserve a small CPU fraction per bundle, so a pool of 4 fits on a
2-core machine.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hf_controller.errors import ConfigurationError
from hf_controller.ray.cluster import ensure_ray
from hf_controller.worker_group import ResourcePool

PLACEMENT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class BundleSlot:
    """One worker's place: a bundle of a placement group (one placement group per node)."""

    placement_group: Any
    bundle_index: int


class RayResourcePool(ResourcePool):
    """Reserved bundles for ``process_on_nodes`` worker processes."""

    def __init__(
        self,
        process_on_nodes: Sequence[int] | None = None,
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        detached: bool = False,
        cpus_per_bundle: float | None = None,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or f"hf_pool_{uuid.uuid4().hex[:8]}"
        self.detached = detached
        self.cpus_per_bundle = (
            cpus_per_bundle if cpus_per_bundle is not None else (1.0 if use_gpu else 0.1)
        )
        if self.cpus_per_bundle <= 0:
            raise ConfigurationError(f"cpus_per_bundle must be > 0, got {self.cpus_per_bundle}")
        self._slots: list[BundleSlot] | None = None

    def bundle(self) -> dict[str, float]:
        """Resources reserved per worker process."""
        resources = {"CPU": self.cpus_per_bundle}
        if self.use_gpu:
            resources["GPU"] = 1.0
        return resources

    def actor_resources(self) -> dict[str, float]:
        """``num_cpus`` / ``num_gpus`` of one actor (a share of its bundle)."""
        share = {"num_cpus": self.cpus_per_bundle / self.max_colocate_count}
        if self.use_gpu:
            share["num_gpus"] = 1.0 / self.max_colocate_count
        return share

    def slots(self) -> list[BundleSlot]:
        """The bundles in rank order, reserving them on first use."""
        if self._slots is None:
            self._slots = self._reserve()
        return self._slots

    def _reserve(self) -> list[BundleSlot]:
        ensure_ray()
        slots = []
        for node_index, count in enumerate(self.store):
            group = self._placement_group(f"{self.name_prefix}_pg_{node_index}", count)
            slots += [BundleSlot(group, i) for i in range(count)]
        return slots

    def _placement_group(self, name: str, count: int) -> Any:
        import ray
        from ray.util.placement_group import get_placement_group

        bundles = [self.bundle() for _ in range(count)]
        try:
            existing = get_placement_group(name)
        except ValueError:
            existing = None
        if existing is not None:
            if existing.bundle_specs != bundles:
                raise ConfigurationError(
                    f"placement group {name!r} already exists with bundles "
                    f"{existing.bundle_specs}, not {bundles}; use another name_prefix, or remove "
                    f"it with ray.util.remove_placement_group if no group uses it any more"
                )
            return self._wait_ready(existing, name)  # a restarted driver reattaches
        lifetime = "detached" if self.detached else None
        group = ray.util.placement_group(
            bundles, strategy="STRICT_PACK", name=name, lifetime=lifetime
        )
        return self._wait_ready(group, name)

    def _wait_ready(self, group: Any, name: str) -> Any:
        import ray

        ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise ConfigurationError(
                f"placement group {name!r} ({len(group.bundle_specs)} x {self.bundle()}) could not "
                f"be placed within {PLACEMENT_TIMEOUT_S:.0f}s; the cluster has "
                f"{ray.available_resources()} available. Use fewer processes, use_gpu=False, or "
                f"a smaller cpus_per_bundle."
            )
        return group

    def release(self) -> None:
        """Give the reserved bundles back to Ray."""
        from ray.util.placement_group import remove_placement_group

        for group in {id(s.placement_group): s.placement_group for s in self._slots or []}.values():
            remove_placement_group(group)
        self._slots = None


class _SlotPool(RayResourcePool):
    """A pool over already reserved bundles (result of a split or a merge)."""

    def __init__(self, parent: RayResourcePool, slots: list[BundleSlot]) -> None:
        counts: dict[int, int] = {}
        for slot in slots:
            counts[id(slot.placement_group)] = counts.get(id(slot.placement_group), 0) + 1
        super().__init__(
            list(counts.values()),
            use_gpu=parent.use_gpu,
            name_prefix=parent.name_prefix,
            max_colocate_count=parent.max_colocate_count,
            detached=parent.detached,
            cpus_per_bundle=parent.cpus_per_bundle,
        )
        self._slots = slots


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
        parts.append(_SlotPool(pool, slots[start : start + size]))
        start += size
    return parts


def merge_resource_pool(first: RayResourcePool, second: RayResourcePool) -> RayResourcePool:
    """One pool holding the processes of ``first`` then ``second`` (same kind of resources)."""
    if first.use_gpu != second.use_gpu or first.max_colocate_count != second.max_colocate_count:
        raise ConfigurationError(
            "cannot merge pools with different use_gpu or max_colocate_count: "
            f"use_gpu {first.use_gpu} vs {second.use_gpu}, "
            f"max_colocate_count {first.max_colocate_count} vs {second.max_colocate_count}"
        )
    return _SlotPool(first, first.slots() + second.slots())
