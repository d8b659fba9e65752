"""Where a worker sits among the data-parallel replicas of its engine.

The role workers dispatch their ``DataProto`` methods through the controller's mesh-aware
mode (``make_nd_compute_dataproto_dispatch_fn(ENGINE_MESH)``): the batch is split once per
data-parallel replica, every rank of a replica (its tensor / pipeline parallel ranks)
receives that replica's rows, and the result is gathered from one rank per replica.

* FSDP: every rank is its own replica (``dp_rank = rank``) and every rank is gathered.
* Megatron: the replica is megatron's data-parallel rank; every rank of a replica ends up
  with the replica's outputs (the last pipeline stage broadcasts them), and the rank
  gathered is tensor-parallel rank 0 on the last pipeline stage.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from hf_engines.config import EngineConfig

ENGINE_MESH = "engine"
"""Mesh name the engine role workers register and dispatch through."""


@dataclass(frozen=True)
class DataParallelPlace:
    """One rank's place among the data-parallel replicas of its engine."""

    rank: int
    """This rank's data-parallel replica (0 .. size - 1)."""
    size: int
    """Number of data-parallel replicas."""
    is_collect: bool
    """Whether the controller gathers this rank's outputs (one rank per replica)."""
    group: Any = None
    """The process group of this rank's data-parallel peers (``None``: the whole world)."""


def data_parallel_place(config: EngineConfig, rank: int, world_size: int) -> DataParallelPlace:
    """This rank's data-parallel place under ``config.backend`` (after the engine is built).

    Megatron's answer comes from its ``parallel_state``, which the engine initialised.
    """
    if config.backend != "megatron":
        return DataParallelPlace(rank=rank, size=world_size, is_collect=True)
    state = importlib.import_module("megatron.core.parallel_state")
    pipeline_last = state.get_pipeline_model_parallel_world_size() - 1
    return DataParallelPlace(
        rank=int(state.get_data_parallel_rank()),
        size=int(state.get_data_parallel_world_size()),
        is_collect=(
            state.get_tensor_model_parallel_rank() == 0
            and state.get_pipeline_model_parallel_rank() == pipeline_last
        ),
        group=state.get_data_parallel_group(),
    )


def data_parallel_size(config: EngineConfig, world_size: int) -> int:
    """Data-parallel replicas ``world_size`` ranks make under ``config`` (before building)."""
    if config.backend == "megatron":
        return int(config.megatron.data_parallel_size(world_size))
    return world_size
