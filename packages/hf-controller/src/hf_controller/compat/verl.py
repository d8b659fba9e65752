"""verl's single-controller names over hf-controller (rename only, for now)."""

from hf_controller import (
    Dispatch,
    Execute,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    make_nd_compute_dataproto_dispatch_fn,
    merge_resource_pool,
    register,
    register_dispatch_mode,
    update_dispatch_mode,
)
from hf_controller.dispatch import collect_all_to_all

__all__ = [
    "Dispatch",
    "Execute",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "Worker",
    "collect_all_to_all",
    "make_nd_compute_dataproto_dispatch_fn",
    "merge_resource_pool",
    "register",
    "register_dispatch_mode",
    "update_dispatch_mode",
]
