"""verl's ``register_dispatch_mode``: a new mode is also reachable as ``Dispatch.<NAME>``.

verl's ``Dispatch`` is a dynamic enum that grows a member per registered mode;
hf-controller's is a plain ``Enum`` whose added modes are known by name. Here a
registered mode is named both ways: ``Dispatch.MY_MODE`` is the string ``"MY_MODE"``,
which ``@register`` accepts like any registered mode name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hf_controller.decorator import Dispatch
from hf_controller.dispatch import register_dispatch_mode as _register_native


def register_dispatch_mode(
    dispatch_mode_name: str, dispatch_fn: Callable[..., Any], collect_fn: Callable[..., Any]
) -> str:
    """Add the dispatch mode ``dispatch_mode_name`` and expose it as
    ``Dispatch.<dispatch_mode_name>``; returns the mode (its name), for ``@register``."""
    if hasattr(Dispatch, dispatch_mode_name):
        raise ValueError(
            f"dispatch mode {dispatch_mode_name!r} already exists (Dispatch has that name); "
            f"use update_dispatch_mode to replace its functions"
        )
    _register_native(dispatch_mode_name, dispatch_fn, collect_fn)
    # Enum classes refuse to rebind members, not to gain attributes: the name joins them.
    setattr(Dispatch, dispatch_mode_name, dispatch_mode_name)
    return dispatch_mode_name
