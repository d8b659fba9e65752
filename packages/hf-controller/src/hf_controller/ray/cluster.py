"""Starting (or joining) Ray on the user's behalf, on loopback when local."""

from __future__ import annotations

import os
from typing import Any

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ensure_ray(**init_kwargs: Any) -> None:
    """Start a local Ray (dashboard off, bound to 127.0.0.1) unless Ray is running.

    Set ``RAY_ADDRESS`` to join an existing cluster instead. Extra keyword
    arguments go to ``ray.init``.
    """
    import ray

    if ray.is_initialized():
        return
    if not os.environ.get("RAY_ADDRESS"):
        # Ray reads this switch once, at import; set both so the raylet and the
        # driver agree on the loopback address whatever was imported first.
        os.environ.setdefault(LOOPBACK_ENV, "0")
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = os.environ[LOOPBACK_ENV] != "0"
    init_kwargs.setdefault("include_dashboard", False)
    init_kwargs.setdefault("namespace", "hybridflow")
    ray.init(**init_kwargs)
