"""Starting ``torch.distributed`` inside a worker from what its worker group provides.

A Ray worker group sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` for every worker; the local backend (one process, world size 1) sets none,
so a single rank gets an in-memory store instead of a TCP rendezvous.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

_TIMEOUT = timedelta(minutes=30)


def pick_backend(device: str) -> str:
    """``nccl`` when the engine computes on CUDA, else ``gloo``.

    ``device`` is the engine config's ``auto`` / ``cpu`` / ``cuda``; ``auto`` means CUDA
    whenever a CUDA device is visible.
    """
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return "nccl"
    return "gloo"


def init_distributed(rank: int, world_size: int, local_rank: int, device: str = "auto") -> None:
    """Initialise the default process group for this worker, unless one already exists.

    Several roles fused into one process (``create_colocated_worker_cls_fused``) share
    that process's group: the first role to start creates it, the others reuse it.
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
    if backend == "nccl":
        torch.cuda.set_device(local_rank % max(torch.cuda.device_count(), 1))
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        dist.init_process_group(
            backend, init_method="env://", rank=rank, world_size=world_size, timeout=_TIMEOUT
        )
        return
    if world_size != 1:
        raise RuntimeError(
            f"rank {rank} of {world_size} has no MASTER_ADDR / MASTER_PORT to meet the other "
            "ranks at; run the group on Ray (RayWorkerGroup) or, with the local backend, "
            "use a world size of 1"
        )
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=_TIMEOUT)
