"""The three ways ``bench_controller.py`` calls a group of workers, and how it starts them.

* raw Ray: plain actors, called with ``ray.get([a.method.remote() for a in actors])``;
  the floor a controller adds its cost to.
* hf-controller: ``hf_controller.RayWorkerGroup`` over a ``RayResourcePool`` of CPU bundles.
* verl 0.9.1: ``verl.single_controller.ray.RayWorkerGroup`` over its own ``RayResourcePool``.

All three worker classes do the same work: ``noop`` returns ``None``; ``echo`` reads
both ends of every tensor column it received (so the argument really is
deserialised) and returns what it got, which makes the worker serialise the same
bytes back. The worker code refers to no module but the controller it runs under,
so a raw Ray or hf-controller worker never imports torch just to answer ``noop``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from hf_controller import Dispatch, RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, Worker
from hf_controller import register as hf_register


def column_ends(columns: Iterable[Any]) -> float:
    """Sum of the first and the last element of every column: reads both ends of each buffer."""
    total = 0.0
    for column in columns:
        flat = column.reshape(-1)
        total += float(flat[0]) + float(flat[-1])
    return total


class RawWorker:
    """A plain Ray actor: no dispatch, no collect, no checks."""

    def noop(self) -> None:
        """Do nothing."""
        return None

    def echo(self, columns: dict[str, Any]) -> dict[str, Any]:
        """Read both ends of every numeric column, return the columns unchanged."""
        column_ends(value for key, value in columns.items() if key != "uid")
        return columns


class HfWorker(Worker):
    """The same two methods as :class:`RawWorker`, registered with hf-controller."""

    @hf_register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        """Do nothing on every rank."""
        return None

    @hf_register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: Any) -> Any:
        """Read both ends of every tensor column of this rank's shard, return the shard."""
        column_ends(data.batch.values())
        return data


def verl_worker_class() -> type:
    """The same two methods on verl's ``Worker`` (built on demand: verl is optional)."""
    from verl.single_controller.base import Worker as VerlWorker
    from verl.single_controller.base.decorator import Dispatch as VerlDispatch
    from verl.single_controller.base.decorator import register as verl_register

    class VerlBenchWorker(VerlWorker):
        @verl_register(dispatch_mode=VerlDispatch.ONE_TO_ALL)
        def noop(self) -> None:
            return None

        @verl_register(dispatch_mode=VerlDispatch.DP_COMPUTE_PROTO)
        def echo(self, data: Any) -> Any:
            column_ends(data.batch.values())
            return data

    return VerlBenchWorker


@dataclass
class Groups:
    """``n`` workers three times over: raw actors, an hf-controller group, a verl group."""

    size: int
    raw: list[Any]
    hf: Any
    verl: Any | None
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def stop(self) -> None:
        """Kill every worker and give the reserved bundles back to Ray."""
        for cleanup in reversed(self.cleanups):
            cleanup()
        self.cleanups.clear()


def start_groups(size: int, with_verl: bool) -> Groups:
    """Start ``size`` workers for each contender and wait until all of them answer.

    verl's CPU pool reserves ``max_colocate_count`` logical CPUs per bundle and each
    of its actors asks for one CPU; ``max_colocate_count=1`` (what verl's FSDP
    trainer uses) keeps that to one logical CPU per worker.
    """
    import ray

    ship_by_value()
    raw: list[Any] = [ray.remote(RawWorker).remote() for _ in range(size)]
    groups = Groups(size, raw, hf=None, verl=None)
    groups.cleanups.append(partial(kill_actors, raw))

    hf_pool = RayResourcePool([size], use_gpu=False, name_prefix=f"bench_hf_{size}")
    groups.hf = RayWorkerGroup(hf_pool, RayClassWithInitArgs(cls=HfWorker))
    groups.cleanups += [hf_pool.release, groups.hf.kill]

    if with_verl:
        groups.verl = start_verl_group(size, groups.cleanups)
    ray.get([actor.noop.remote() for actor in raw])
    groups.hf.noop()
    if groups.verl is not None:
        groups.verl.noop()
    return groups


def start_verl_group(size: int, cleanups: list[Callable[[], None]]) -> Any:
    """A verl ``RayWorkerGroup`` of ``size`` CPU workers; registers its own cleanup."""
    import ray
    from ray.util.placement_group import remove_placement_group
    from verl.single_controller.ray import RayClassWithInitArgs as VerlClassWithInitArgs
    from verl.single_controller.ray import RayResourcePool as VerlResourcePool
    from verl.single_controller.ray import RayWorkerGroup as VerlWorkerGroup

    ship_by_value()
    # verl warns that it found no accelerator and falls back to CUDA: expected with use_gpu=False.
    logging.getLogger("verl.plugin.platform").setLevel(logging.ERROR)
    pool = VerlResourcePool([size], use_gpu=False, max_colocate_count=1)
    group = VerlWorkerGroup(
        resource_pool=pool,
        ray_cls_with_init=VerlClassWithInitArgs(cls=ray.remote(verl_worker_class())),
    )

    def stop() -> None:
        kill_actors(group.workers)
        for placement_group in pool.pgs or []:
            remove_placement_group(placement_group)

    cleanups.append(stop)
    return group


def ship_by_value() -> None:
    """Send this module's classes to the workers by value: tools/bench is not installed,
    so a worker process could not import it by name."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def kill_actors(actors: Iterable[Any]) -> None:
    """End the processes of ``actors``."""
    import ray

    for actor in actors:
        ray.kill(actor)
