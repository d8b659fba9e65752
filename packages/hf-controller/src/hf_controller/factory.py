"""``make_worker_group``: build a worker group on the backend the caller (or the environment) picks.

``RayWorkerGroup(...)`` always builds Ray actors and ``LocalWorkerGroup(...)`` always
runs the workers in the driver; a driver that should run on either calls this
factory, so ``HF_CONTROLLER_BACKEND=local`` moves all of its groups into the driver
process for debugging without a code change.
"""

from __future__ import annotations

import os
from typing import Any

from hf_controller.errors import ConfigurationError
from hf_controller.local.worker_group import LocalWorkerGroup
from hf_controller.ray.resource_pool import RayResourcePool
from hf_controller.ray.worker_group import RayWorkerGroup
from hf_controller.worker_class import ClassWithInitArgs
from hf_controller.worker_group import ResourcePool, WorkerGroup

BACKEND_ENV = "HF_CONTROLLER_BACKEND"
"""Environment variable naming the backend when the caller passes ``backend=None``."""

BACKENDS = ("ray", "local")
"""The backends :func:`make_worker_group` can build."""


def make_worker_group(
    resource_pool: ResourcePool | None,
    cls_with_init: ClassWithInitArgs,
    *,
    backend: str | None = None,
    **kwargs: Any,
) -> WorkerGroup:
    """A worker group of ``cls_with_init`` on ``resource_pool``, Ray or local.

    ``backend`` is ``"ray"`` (a :class:`~hf_controller.RayWorkerGroup`, which needs a
    :class:`~hf_controller.RayResourcePool`) or ``"local"`` (a
    :class:`~hf_controller.LocalWorkerGroup` with the pool's world size, or
    ``world_size=``, ranks in this process). ``None`` reads ``HF_CONTROLLER_BACKEND``
    and defaults to ``"ray"``. ``kwargs`` go to the group's constructor
    (``name_prefix``, ``worker_env``, ``detached``, ...).
    """
    from_env = backend is None
    chosen = (os.environ.get(BACKEND_ENV) or "ray") if backend is None else backend
    if chosen == "local":
        return LocalWorkerGroup(resource_pool, cls_with_init, **kwargs)
    if chosen != "ray":
        source = f" (from {BACKEND_ENV})" if from_env else ""
        raise ConfigurationError(
            f"unknown worker-group backend {chosen!r}{source}; "
            f"choose one of {', '.join(repr(b) for b in BACKENDS)}"
        )
    if resource_pool is not None and not isinstance(resource_pool, RayResourcePool):
        raise ConfigurationError(
            f"the Ray backend places workers on a RayResourcePool, got "
            f"{type(resource_pool).__name__}; build the pool with "
            f"RayResourcePool({resource_pool.store})"
        )
    return RayWorkerGroup(resource_pool, cls_with_init, **kwargs)
