"""Megatron's process groups (tensor / pipeline / data parallel) for an engine."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from hf_engines.config import MegatronConfig
from hf_engines.distributed import resolve_compute_device
from hf_engines.megatron.cpu_compat import enable_cpu_execution

MEGATRON_NOISE = (
    "full scope is deprecated",
    "When using async grad allreduce it is recommended to set the environment variable "
    "CUDA_DEVICE_MAX_CONNECTIONS",
    r"`torch.distributed.all_gather_into_tensor` is deprecated",
)
"""Warnings megatron-core 0.16 raises on every engine or every step that say nothing about the
user's run: a default of its own config, a CUDA-only tuning hint, and torch's rename of a
collective that megatron's tensor-parallel mappings still call."""


def silence_megatron_noise() -> None:
    """Ignore :data:`MEGATRON_NOISE` (each by its message's start) in this process."""
    for message in MEGATRON_NOISE:
        warnings.filterwarnings("ignore", message=message)


def resolve_device(config: MegatronConfig) -> torch.device:
    """The compute device: CUDA when asked, or with ``auto`` when the backend is NCCL."""
    return resolve_compute_device(config.device, "megatron")


def initialize_parallel(config: MegatronConfig) -> torch.device:
    """Create megatron's groups over the default process group; return the compute device.

    Idempotent for the same layout (several engines in one process share the groups); a
    different layout in the same process is an error, since megatron's state is global.
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "MegatronEngine needs torch.distributed to be initialised first; call "
            "torch.distributed.init_process_group('gloo') on CPU or ('nccl') on CUDA "
            "(a worker group sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for it)"
        )
    config.data_parallel_size(dist.get_world_size())  # raises naming the fix
    silence_megatron_noise()
    device = resolve_device(config)
    if device.type == "cpu":
        enable_cpu_execution()
    tp, pp = config.tensor_model_parallel_size, config.pipeline_model_parallel_size
    ep = config.expert_model_parallel_size
    if parallel_state.model_parallel_is_initialized():
        have = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size(),
        )
        if have != (tp, pp, ep):
            raise RuntimeError(
                f"megatron is already initialised in this process with (tensor, pipeline, "
                f"expert) parallel sizes {have}, not {(tp, pp, ep)}; engines sharing a process "
                "must use the same megatron layout"
            )
        return device
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
        create_gloo_process_groups=False,
    )
    return device


def pipeline_rank_of_stage(stage: int) -> int:
    """Global rank of pipeline stage ``stage`` in this rank's pipeline group."""
    return int(
        dist.get_process_group_ranks(parallel_state.get_pipeline_model_parallel_group())[stage]
    )


def tensor_parallel_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every tensor-parallel rank's ``tensor`` (same shape on each), in rank order."""
    size = parallel_state.get_tensor_model_parallel_world_size()
    if size == 1:
        return [tensor]
    shards = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(
        shards, tensor.contiguous(), group=parallel_state.get_tensor_model_parallel_group()
    )
    return shards
