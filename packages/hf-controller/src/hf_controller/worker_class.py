"""A worker class as the controller sees it: init arguments, registered methods, roles.

Worker groups (both backends) and colocation read worker classes through these
helpers; the module imports neither of them, so each can import it.
"""

from __future__ import annotations

from typing import Any

from hf_controller.decorator import MethodSpec, method_spec

ROLES_ATTR = "__hf_colocated_roles__"
"""Attribute of a colocated worker class: ``{role: role class}``."""


class ClassWithInitArgs:
    """A worker class and the arguments to construct it with, kept until the group creates it."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        self.cls = cls
        self.args = args
        self.kwargs = kwargs

    @property
    def user_class(self) -> type:
        """The plain Python class (unwrapped from ``@ray.remote`` when decorated)."""
        return unwrap_worker_class(self.cls)

    def __call__(self) -> Any:
        """Construct the worker in this process."""
        return self.user_class(*self.args, **self.kwargs)


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class (plain or ``@ray.remote``) with constructor arguments and actor options.

    The options apply to Ray groups; the local backend ignores them.
    """

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        super().__init__(cls, *args, **kwargs)
        self.options: dict[str, Any] = {}

    def update_options(self, options: dict[str, Any]) -> None:
        """Extra ``ray.remote`` options for every actor (e.g. ``max_concurrency``)."""
        self.options.update(options)


def unwrap_worker_class(cls: Any) -> type:
    """The user's class behind a ``@ray.remote`` actor class (or ``cls`` itself)."""
    inner = getattr(cls, "__ray_actor_class__", None)
    return inner if isinstance(inner, type) else cls


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """Every ``@register``-ed method of ``cls`` (inherited ones included) and its spec."""
    found = {}
    for name in dir(cls):
        spec = method_spec(getattr(cls, name, None))
        if spec is not None:
            found[name] = spec
    return found


def role_classes(cls_with_init: ClassWithInitArgs) -> dict[str, type]:
    """The role classes of a colocated worker class."""
    roles = getattr(unwrap_worker_class(cls_with_init.cls), ROLES_ATTR, None)
    if roles is None:
        raise ValueError(
            "spawn/fuse need a worker class made by create_colocated_worker_cls(_fused); "
            f"got {cls_with_init.cls!r}"
        )
    return dict(roles)
