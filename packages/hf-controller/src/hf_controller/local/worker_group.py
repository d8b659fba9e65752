"""``LocalWorkerGroup``: the same worker classes, run in the driver process.

Every rank is an ordinary object in this process and calls run one after the
other, so ``breakpoint()`` inside a worker method stops right there and a
debugger steps from the driver into the worker. Dispatch and collect are the
very same as on Ray. Build it directly, or with
``make_worker_group(..., backend="local")`` / ``HF_CONTROLLER_BACKEND=local`` where the
driver builds its groups with :func:`hf_controller.make_worker_group`; no other change
to the driver is needed.

Differences from Ray: ``blocking=False`` returns the results (already
computed); call deadlines (``call_timeout_s``, ``@register(timeout_s=...)``) do not
apply, since every call runs in the driver; ranks share one process, so
``torch.distributed`` with more than one rank cannot be initialised.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import traceback
from typing import Any

from hf_controller.errors import WorkerGroupError
from hf_controller.worker import WorkerIdentity, worker_context
from hf_controller.worker_class import ClassWithInitArgs, unwrap_worker_class
from hf_controller.worker_group import ResourcePool, WorkerGroup


class LocalWorkerGroup(WorkerGroup):
    """A worker group whose ranks are objects in the driver process."""

    def __init__(
        self,
        resource_pool: ResourcePool | None = None,
        ray_cls_with_init: ClassWithInitArgs | None = None,
        name_prefix: str | None = None,
        worker_env: dict[str, str] | None = None,
        world_size: int | None = None,
        call_timeout_s: float | None = None,
        **ignored_ray_options: Any,
    ) -> None:
        if ray_cls_with_init is None:
            raise ValueError("LocalWorkerGroup needs ray_cls_with_init (the worker class)")
        size = resource_pool.world_size if resource_pool is not None else (world_size or 1)
        user_class = unwrap_worker_class(ray_cls_with_init.cls)
        name = name_prefix or f"{user_class.__name__}_local"
        super().__init__(name, size, call_timeout_s)
        self.cls_with_init = self.ray_cls_with_init = ray_cls_with_init
        os.environ.update(worker_env or {})
        self._workers = []
        for rank in range(size):
            identity = WorkerIdentity(rank, size, rank, size, name)
            with worker_context(identity):
                self._workers.append(
                    user_class(*ray_cls_with_init.args, **ray_cls_with_init.kwargs)
                )
        self._bind_worker_methods(user_class)

    @property
    def workers(self) -> list[Any]:
        """The worker objects, in rank order (inspect them freely)."""
        return list(self._workers)

    def _execute(
        self, method: str, calls: list[tuple[tuple[Any, ...], dict[str, Any]]], ranks: list[int]
    ) -> list[Any]:
        results = []
        for rank, (args, kwargs) in zip(ranks, calls, strict=True):
            try:
                result = getattr(self._workers[rank], method)(*args, **kwargs)
                if inspect.iscoroutine(result):
                    result = asyncio.run(result)
            except Exception as error:
                cause = f"{type(error).__name__}: {error}"
                raise WorkerGroupError(
                    self.name, rank, method, "local", cause, traceback.format_exc()
                ) from error
            results.append(result)
        return results

    def _wait(
        self, method: str, handles: list[Any], ranks: list[int], timeout_s: float | None = None
    ) -> list[Any]:
        # Calls ran to completion in _execute, in this process: a deadline cannot apply
        # (a stuck method is stuck in the driver, where a debugger can see it).
        return handles

    def _workers_alive(self) -> bool:
        return bool(self._workers)

    def _end_workers(self) -> None:
        self._workers = []  # the counterpart of ending RayWorkerGroup's processes
