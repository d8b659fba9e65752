"""verl's single-controller names and semantics over hf-controller.

Worker code written for verl runs here with its imports changed:
``verl.single_controller.*``, ``verl.utils.device`` and ``verl.utils.ray_utils`` ->
``hf_controller.compat.verl``. Where hf-controller's own API is deliberately different
the classes here adapt it (docs/from-verl.md lists every name and difference).
"""

from hf_controller.colocation import create_colocated_worker_cls, create_colocated_worker_cls_fused
from hf_controller.compat.verl.colocation import create_colocated_worker_raw_cls
from hf_controller.compat.verl.device import (
    get_device_name,
    get_nccl_backend,
    get_torch_device,
    is_cuda_available,
)
from hf_controller.compat.verl.dispatch import register_dispatch_mode
from hf_controller.compat.verl.errors import VerlCheckError
from hf_controller.compat.verl.ray_utils import parallel_put
from hf_controller.compat.verl.worker import Worker
from hf_controller.compat.verl.worker_group import RayWorkerGroup
from hf_controller.decorator import Dispatch, Execute, register
from hf_controller.dispatch import (
    collect_all_to_all,
    make_nd_compute_dataproto_dispatch_fn,
    update_dispatch_mode,
)
from hf_controller.ray.resource_pool import RayResourcePool, merge_resource_pool
from hf_controller.worker_class import ClassWithInitArgs, RayClassWithInitArgs

__all__ = [
    "ClassWithInitArgs",
    "Dispatch",
    "Execute",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "VerlCheckError",
    "Worker",
    "collect_all_to_all",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "get_device_name",
    "get_nccl_backend",
    "get_torch_device",
    "is_cuda_available",
    "make_nd_compute_dataproto_dispatch_fn",
    "merge_resource_pool",
    "parallel_put",
    "register",
    "register_dispatch_mode",
    "update_dispatch_mode",
]
