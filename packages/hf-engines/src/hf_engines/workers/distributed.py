"""Starting ``torch.distributed`` inside a worker from what its worker group provides.

A Ray worker group sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` for every worker; the local backend (one process, world size 1) sets none,
so a single rank gets an in-memory store instead of a TCP rendezvous.

A group started here is also ended here: :func:`shutdown_distributed` (registered with
``atexit`` by :func:`init_distributed`) has every rank say goodbye through the rendezvous
store and destroys the process group before the interpreter tears down, with rank 0 (the
store's host) leaving last. A rank that exits with a live gloo group while a peer still
holds its connections, or whose store host has already gone, can abort in C++ at exit
("terminate called without an active exception", exit code -6).
"""

from __future__ import annotations

import atexit
import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from hf_protocol.rendezvous import pin_transports_to_loopback, store_on

_LOG = logging.getLogger(__name__)

TIMEOUT_ENV = "HF_DIST_TIMEOUT_S"
"""Environment variable overriding :data:`DEFAULT_TIMEOUT_S` for every worker's group."""
EXIT_TIMEOUT_S = 30.0
"""How long :func:`shutdown_distributed` waits at exit for the other ranks to reach theirs
(a peer that died or hangs costs this much once, never a hang)."""
_EXIT_KEY = "hf_engines/exit"
DEFAULT_TIMEOUT_S = 600.0
"""How long a collective waits for its peers before failing: a peer that died or hangs
ends the others' collectives with an error (gloo: at once when the peer's connection
drops; otherwise after this long) instead of leaving them blocked forever."""


def collective_timeout(timeout_s: float | None = None) -> timedelta:
    """The process-group timeout: ``timeout_s``, else :data:`TIMEOUT_ENV`, else
    :data:`DEFAULT_TIMEOUT_S`; anything but a positive number of seconds is refused."""
    source = "timeout_s"
    if timeout_s is None:
        text = os.environ.get(TIMEOUT_ENV, "").strip()
        source = TIMEOUT_ENV
        try:
            timeout_s = float(text) if text else DEFAULT_TIMEOUT_S
        except ValueError:
            timeout_s = -1.0
    if not timeout_s > 0:
        raise ValueError(
            f"{source} must be a positive number of seconds for torch.distributed "
            f"collectives, got {timeout_s!r}; e.g. {TIMEOUT_ENV}=600"
        )
    return timedelta(seconds=timeout_s)


def pick_backend(device: str) -> str:
    """``nccl`` when the engine computes on CUDA, else ``gloo``.

    ``device`` is the engine config's ``auto`` / ``cpu`` / ``cuda``; ``auto`` means CUDA
    whenever a CUDA device is visible. ``cuda`` without a visible device raises (never a
    silent CPU run).
    """
    if device == "cuda" and not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
        raise RuntimeError(
            f"the engine's device is 'cuda', but this process sees no CUDA device (torch "
            f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}, "
            f"CUDA_VISIBLE_DEVICES={visible}); give the worker a GPU, or set the engine's "
            "device to 'cpu' to train on the CPU"
        )
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return "nccl"
    return "gloo"


def init_distributed(
    rank: int,
    world_size: int,
    local_rank: int,
    device: str = "auto",
    timeout_s: float | None = None,
) -> None:
    """Initialise the default process group for this worker, unless one already exists.

    Several roles fused into one process (``create_colocated_worker_cls_fused``) share
    that process's group: the first role to start creates it, the others reuse it.
    ``timeout_s`` bounds every collective (see :func:`collective_timeout`). Rank 0 hosts
    the rendezvous store on ``MASTER_ADDR`` only (never on every interface), and a local
    run's gloo / NCCL sockets stay on the loopback (:mod:`hf_protocol.rendezvous`).
    """
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise RuntimeError(
                f"torch.distributed is already initialised with world size "
                f"{dist.get_world_size()}, but this worker's group has {world_size} ranks; "
                "roles fused into one process must come from worker groups of the same size"
            )
        return
    backend = pick_backend(device)
    timeout = collective_timeout(timeout_s)
    if backend == "nccl":
        torch.cuda.set_device(local_rank % max(torch.cuda.device_count(), 1))
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        pin_transports_to_loopback(host)
        store = store_on(host, port, world_size, is_master=rank == 0, timeout=timeout)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
        _end_at_exit()
        return
    if world_size != 1:
        raise RuntimeError(
            f"rank {rank} of {world_size} has no MASTER_ADDR / MASTER_PORT to meet the other "
            "ranks at; run the group on Ray (RayWorkerGroup) or, with the local backend, "
            "use a world size of 1"
        )
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    _end_at_exit()


_AT_EXIT: list[bool] = []


def _end_at_exit() -> None:
    """Register :func:`shutdown_distributed` with ``atexit`` (once per process)."""
    if not _AT_EXIT:
        atexit.register(shutdown_distributed)
        _AT_EXIT.append(True)


def _exit_step(store: dist.Store, rank: int, world_size: int, step: str, wait_s: float) -> bool:
    """Mark ``step`` done for this rank in the rendezvous store and wait (at most
    ``wait_s`` seconds) until every rank that takes part has: all ranks for ``leaving``,
    only rank 0 (for ranks > 0) for ``done``. ``False`` (logged) when that failed."""
    key = f"{_EXIT_KEY}/{step}"
    try:
        if step == "leaving" or rank != 0:
            store.set(f"{key}/{rank}", "1")
        if step == "leaving" or rank == 0:
            first = 0 if step == "leaving" else 1
            keys = [f"{key}/{r}" for r in range(first, world_size)]
            store.wait(keys, timedelta(seconds=wait_s))
    except Exception as error:  # a peer or the store's host gone: end our own group anyway
        _LOG.warning("rank %d of %d: no exit handshake at %s (%s)", rank, world_size, step, error)
        return False
    return True


def shutdown_distributed(timeout_s: float = EXIT_TIMEOUT_S) -> bool:
    """End this process's default process group, if there is one; ``True`` when the
    other ranks took part in the exit handshake (or there are none).

    Called on every rank (collective, but bounded: a rank whose peers died or hang waits
    ``timeout_s`` seconds at most, once, then ends its group anyway). Every rank marks that it
    is leaving in the rendezvous store and waits for the others (no collective is still
    running anywhere); ranks > 0 destroy their group and then mark ``done`` (their last use
    of the store); rank 0, the store's host, waits for that before it destroys its own, so
    it is the last to go. :func:`init_distributed` registers it with ``atexit``; calling
    it earlier is fine.
    """
    if not dist.is_initialized():
        return True
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if world_size == 1:
        dist.destroy_process_group()
        return True
    store = dist.distributed_c10d._get_default_store()  # kept alive past the group's end
    met = _exit_step(store, rank, world_size, "leaving", timeout_s)
    if rank != 0:
        dist.destroy_process_group()
    if met:  # a peer that never reached its exit will not mark done either
        met = _exit_step(store, rank, world_size, "done", timeout_s)
    if rank == 0:
        dist.destroy_process_group()
    return met
