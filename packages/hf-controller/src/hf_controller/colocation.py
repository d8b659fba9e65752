"""Several roles in one worker process: colocated and fused worker classes.

``create_colocated_worker_cls({"actor": ..., "critic": ...})`` builds one worker
class whose instance constructs every role; each role's registered method ``m``
is exposed as ``{role}_m``. A group of that class can ``spawn`` / ``fuse`` one
group view per role. The *fused* variant also gives every role a
``fused_workers`` dict of its siblings, so roles hand data (weights, caches) to
each other in memory instead of through Ray, and the fused worker reaches each role as
an attribute (``self.actor``), for methods of a subclass of the fused class.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from hf_controller.decorator import MAGIC_ATTR
from hf_controller.worker import Worker
from hf_controller.worker_class import (
    ROLES_ATTR,
    ClassWithInitArgs,
    RayClassWithInitArgs,
    registered_methods,
    unwrap_worker_class,
)


def _forwarder(role: str, name: str, target: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(target):

        async def forward_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self.workers[role], name)(*args, **kwargs)

        return forward_async

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.workers[role], name)(*args, **kwargs)

    return forward


def _build(class_dict: dict[str, ClassWithInitArgs], fused: bool) -> RayClassWithInitArgs:
    if not class_dict:
        raise ValueError("a colocated worker needs at least one role")
    roles = {role: unwrap_worker_class(c.cls) for role, c in class_dict.items()}
    init_args = {role: (c.args, c.kwargs) for role, c in class_dict.items()}

    class ColocatedWorker(Worker):
        """One process, several roles (see hf_controller.colocation)."""

        def __init__(self) -> None:
            super().__init__()
            self.workers = {
                role: cls(*init_args[role][0], **init_args[role][1]) for role, cls in roles.items()
            }
            if fused:
                for role, worker in self.workers.items():
                    worker.fused_workers = self.workers
                    if hasattr(self, role):
                        raise ValueError(
                            f"fused role {role!r} clashes with an attribute of the fused worker "
                            f"{type(self).__name__}; rename the role"
                        )
                    setattr(self, role, worker)  # a fused class's own methods: self.actor...

    for role, cls in roles.items():
        for name, spec in registered_methods(cls).items():
            forward = _forwarder(role, name, getattr(cls, name))
            forward.__name__ = f"{role}_{name}"
            setattr(forward, MAGIC_ATTR, spec)
            setattr(ColocatedWorker, f"{role}_{name}", forward)
    ColocatedWorker.__name__ = (
        "Fused_" + "_".join(roles) if fused else "Colocated_" + "_".join(roles)
    )
    setattr(ColocatedWorker, ROLES_ATTR, roles)
    return RayClassWithInitArgs(cls=ColocatedWorker)


def create_colocated_worker_cls(
    class_dict: dict[str, ClassWithInitArgs],
) -> RayClassWithInitArgs:
    """A worker class that hosts every role of ``class_dict`` in one process.

    Any worker group (Ray or local) accepts the result; ``update_options`` on it sets
    Ray actor options.
    """
    return _build(class_dict, fused=False)


def create_colocated_worker_cls_fused(
    class_dict: dict[str, ClassWithInitArgs],
) -> RayClassWithInitArgs:
    """Like :func:`create_colocated_worker_cls`; each role also sees its siblings in
    ``self.fused_workers`` (same process, shared memory)."""
    return _build(class_dict, fused=True)
