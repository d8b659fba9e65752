"""hf-controller: the HybridFlow single controller.

One driver process calls methods on groups of SPMD workers placed by Ray; each
call is split across the workers (dispatch), run on all of them (execute) and
gathered back (collect). Needs only Ray; DataProto support comes with
``hf-controller[protocol]``.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

from hf_controller.colocation import create_colocated_worker_cls, create_colocated_worker_cls_fused
from hf_controller.decorator import Dispatch, Execute, register
from hf_controller.dispatch import (
    make_nd_compute_dataproto_dispatch_fn,
    register_dispatch_mode,
    update_dispatch_mode,
)
from hf_controller.errors import (
    ConfigurationError,
    WaitTimeoutError,
    WorkerDiedError,
    WorkerGroupError,
    WorkerTimeoutError,
    is_worker_death,
)
from hf_controller.factory import make_worker_group
from hf_controller.futures import GroupFuture
from hf_controller.host_memory import release_host_memory, resident_bytes
from hf_controller.local import LocalWorkerGroup
from hf_controller.ray.cluster import (
    NodeSummary,
    cluster_nodes,
    dashboard_url,
    ensure_ray,
    start_ray_in_background,
)
from hf_controller.ray.resource_pool import (
    RayResourcePool,
    merge_resource_pool,
    split_resource_pool,
)
from hf_controller.ray.worker_group import RayWorkerGroup
from hf_controller.sharding import split_balanced
from hf_controller.tracing import CallTiming, export_chrome_trace
from hf_controller.waiting import (
    ResultWaiter,
    dead_workers,
    wait_all,
    wait_any,
    wait_together,
)
from hf_controller.worker import Worker
from hf_controller.worker_class import ClassWithInitArgs, RayClassWithInitArgs
from hf_controller.worker_group import ResourcePool, WorkerGroup

try:  # the installed distribution's version, so it cannot drift from pyproject.toml
    __version__ = _distribution_version("hf-controller")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__all__ = [
    "CallTiming",
    "ClassWithInitArgs",
    "ConfigurationError",
    "Dispatch",
    "Execute",
    "GroupFuture",
    "LocalWorkerGroup",
    "NodeSummary",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePool",
    "ResultWaiter",
    "WaitTimeoutError",
    "Worker",
    "WorkerDiedError",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerTimeoutError",
    "cluster_nodes",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "dashboard_url",
    "dead_workers",
    "ensure_ray",
    "export_chrome_trace",
    "is_worker_death",
    "make_nd_compute_dataproto_dispatch_fn",
    "make_worker_group",
    "merge_resource_pool",
    "register",
    "register_dispatch_mode",
    "release_host_memory",
    "resident_bytes",
    "split_balanced",
    "split_resource_pool",
    "start_ray_in_background",
    "update_dispatch_mode",
    "wait_all",
    "wait_any",
    "wait_together",
]
