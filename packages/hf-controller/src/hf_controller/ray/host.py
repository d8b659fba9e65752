"""Worker hosts: worker processes started before their class is known (two-phase start).

A worker process spends seconds importing torch and the worker's modules. A Ray actor
cannot start before the driver has imported its class, so with plain actors those imports
run after the driver's own, in series. A :class:`WorkerHost` is a small actor that
only names the modules to import: placed on a pool's bundle as soon as Ray is up
(:meth:`RayResourcePool.prestart <hf_controller.ray.resource_pool.RayResourcePool.prestart>`),
it imports them while the driver imports its own; the worker group placed on that pool
later builds its worker class inside it (``_hf_construct``) and calls its methods through
it (``_hf_call``). The worker class, its ``__init__`` and its methods run as they would
in an actor of their own, and its printed lines carry the worker's name (``group rank r``)
as usual; only the actor class Ray's state API and dashboard show is ``WorkerHost``, and
each task is named after the worker's method.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Sequence
from typing import Any


class WorkerHost:
    """A Ray actor that imports ``preload`` at start and later hosts one worker object."""

    def __init__(self, preload: Sequence[str]) -> None:
        for module in preload:  # an import error fails the actor's start, named by the group
            importlib.import_module(module)
        self._worker: Any = None

    def _hf_construct(
        self, env: dict[str, str], cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """Set the rank's environment, build ``cls(*args, **kwargs)``; its process info."""
        if self._worker is not None:
            raise RuntimeError(f"this worker host already holds a {type(self._worker).__name__}")
        os.environ.update(env)
        self._worker = cls(*args, **kwargs)
        announce_name(repr(self._worker))
        info: dict[str, Any] = self._worker._hf_process_info()
        return info

    def _hf_call(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` of the hosted worker (positional-only: the worker's own keyword
        arguments may be called anything, ``method`` included)."""
        return getattr(self._worker, method)(*args, **kwargs)

    def __repr__(self) -> str:
        return "worker host" if self._worker is None else repr(self._worker)


def announce_name(name: str) -> None:
    """Give this actor process a new name in Ray's log prefixes (``(name pid=...)``): the
    line Ray itself prints after an actor's ``__init__``, which its log monitor reads."""
    from ray._private.ray_constants import LOG_PREFIX_ACTOR_NAME

    for stream in (sys.stdout, sys.stderr):
        print(f"{LOG_PREFIX_ACTOR_NAME}{name}", file=stream, flush=True)


def can_host(cls: type, options: dict[str, Any], worker_env: dict[str, str] | None) -> bool:
    """Whether a group of ``cls`` can use prestarted hosts: no actor options of its own
    (``max_concurrency``, resources), no environment that must be set before the imports,
    and no ``async`` methods (a host's methods are synchronous)."""
    coroutines = any(
        inspect.iscoroutinefunction(member) for _, member in inspect.getmembers(cls, callable)
    )
    return not options and not worker_env and not coroutines


def start_hosts(
    slots: Sequence[Any], resources: dict[str, float], preload: Sequence[str]
) -> list[Any]:
    """One :class:`WorkerHost` per bundle slot (``BundleSlot``), importing ``preload``."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    host_class: Any = ray.remote(WorkerHost)
    hosts = []
    for slot in slots:
        options: dict[str, Any] = {
            **resources,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                slot.placement_group, slot.bundle_index
            ),
        }
        # No runtime_env: a host may then be one of the idle workers Ray prestarts (Python
        # and Ray already imported). A local Ray started here has the loopback switch in
        # its raylet's environment already (``use_loopback_by_default``), so in every worker's.
        hosts.append(host_class.options(**options).remote(tuple(preload)))
    return hosts
