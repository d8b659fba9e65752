"""``Worker``: the base class of every role that runs as one rank of a group.

A worker learns who it is (rank, world size, group name) from environment
variables that the worker group sets for it (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; also
``RAY_LOCAL_WORLD_SIZE``, the same as ``LOCAL_WORLD_SIZE``, which verl's rollout code reads), so
``torch.distributed.init_process_group()`` works inside it unchanged. The local
backend runs several workers in one process and hands each its identity through
:func:`worker_context` instead.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import random
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_controller.decorator import Dispatch, register
from hf_controller.stacks import enable_stack_dumps
from hf_controller.threads import apply_worker_threads

GROUP_NAME_ENV = "HF_CONTROLLER_GROUP"
RESERVED_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "RAY_LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@dataclass(frozen=True)
class WorkerIdentity:
    """Who a worker is inside its group."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_name: str


_CONTEXT: contextvars.ContextVar[WorkerIdentity | None] = contextvars.ContextVar(
    "hf_controller_worker_identity", default=None
)


@contextlib.contextmanager
def worker_context(identity: WorkerIdentity) -> Iterator[None]:
    """Construct workers inside this block to give them ``identity`` (local backend)."""
    token = _CONTEXT.set(identity)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def _identity_from_env() -> WorkerIdentity:
    return WorkerIdentity(
        rank=int(os.environ.get("RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        group_name=os.environ.get(GROUP_NAME_ENV, "worker"),
    )


def node_ip_address() -> str:
    """The address other processes reach this node on (loopback for a local Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except ImportError:  # the local backend needs no Ray
        pass
    return "127.0.0.1"


def _ray_node_id() -> str:
    """The Ray node id of this process ('' outside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    except ImportError:
        pass
    return ""


RENDEZVOUS_PORTS = (20000, 32768)
"""Where :func:`free_port` looks first: above Ray's worker ports (10002-19999 by default)
and below Linux's default ephemeral range (32768-60999). A port the kernel hands out
(``bind(0)``, every outgoing connection) comes from the ephemeral range, so it can be taken
by any of the node's connections in the seconds between the group choosing it and rank 0
listening on it (seen in CI: ``EADDRINUSE`` in ``init_model``)."""


def _ephemeral_low() -> int:
    """The low end of the kernel's ephemeral port range (32768 when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(address: str, attempts: int = 64) -> int:
    """A TCP port nobody listens on at ``address`` right now, outside the ephemeral range
    when it can (see :data:`RENDEZVOUS_PORTS`); else one the kernel picks."""
    low, high = RENDEZVOUS_PORTS[0], min(RENDEZVOUS_PORTS[1], _ephemeral_low())
    for _ in range(attempts if high > low else 0):
        port = random.randrange(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((address, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def master_address() -> tuple[str, int]:
    """This node's address and a free port on it, for the torch.distributed rendezvous."""
    address = node_ip_address()
    return address, free_port(address)


class Worker:
    """Base class for a group member. Subclass it and mark methods with ``@register``."""

    def __init__(self) -> None:
        self._identity = _CONTEXT.get() or _identity_from_env()
        apply_worker_threads()  # the cores of its bundle (hf_controller.threads)
        self._dp_layouts: dict[str, tuple[int, bool]] = {}

    def _get_identity(self) -> WorkerIdentity:
        # Subclasses that forget super().__init__() still get a working identity.
        identity = self.__dict__.get("_identity")
        if identity is None:
            identity = _CONTEXT.get() or _identity_from_env()
            self.__dict__["_identity"] = identity
        return identity

    @property
    def rank(self) -> int:
        """This worker's rank in its group (0 .. world_size - 1)."""
        return self._get_identity().rank

    @property
    def world_size(self) -> int:
        """Number of workers in the group."""
        return self._get_identity().world_size

    @property
    def local_rank(self) -> int:
        """Rank among the group's workers on this node."""
        return self._get_identity().local_rank

    @property
    def group_name(self) -> str:
        """Name of the group this worker belongs to."""
        return self._get_identity().group_name

    def __repr__(self) -> str:
        # Ray prefixes a worker's printed output with its actor repr: "[group rank]".
        return f"{self.group_name} rank {self.rank}"

    # ------------------------------------------------------------------ mesh layouts

    def _register_dispatch_collect_info(
        self, mesh_name: str, dp_rank: int, is_collect: bool
    ) -> None:
        """Declare this worker's dp rank in ``mesh_name`` and whether its output is gathered."""
        layouts = self.__dict__.setdefault("_dp_layouts", {})
        if mesh_name in layouts:
            raise ValueError(f"mesh {mesh_name!r} is already registered on rank {self.rank}")
        layouts[mesh_name] = (int(dp_rank), bool(is_collect))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> tuple[int, bool]:
        layouts = self.__dict__.get("_dp_layouts", {})
        if mesh_name not in layouts:
            raise KeyError(
                f"rank {self.rank} registered no mesh {mesh_name!r} (known: {sorted(layouts)}); "
                f"call self._register_dispatch_collect_info({mesh_name!r}, dp_rank, is_collect) "
                f"in __init__"
            )
        return layouts[mesh_name]

    # ------------------------------------------------------------------ controller plumbing

    def _hf_process_info(self) -> dict[str, Any]:
        """pid and node of this worker, for error reports, log lookup and stack dumps.

        The group asks it once, right after start-up; it also arms the stack dump that a
        call past its deadline reports (:mod:`hf_controller.stacks`).
        """
        return {
            "pid": os.getpid(),
            "node_ip": node_ip_address(),
            "node_id": _ray_node_id(),
            "hostname": socket.gethostname(),
            "stack_file": enable_stack_dumps(),
        }

    def _hf_master_address(self) -> tuple[str, int]:
        """An address and free port on this node for the torch.distributed rendezvous."""
        return master_address()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``func(self, *args, **kwargs)`` on every worker with its shard of the data."""
        return func(self, *args, **kwargs)
