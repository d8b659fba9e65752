"""The distributed optimizer (ZeRO-1): optimizer state split over data-parallel replicas.

``megatron.use_distributed_optimizer=True`` gives each data-parallel rank a share of the
stage's parameters (whole tensors, balanced by size): its optimizer holds state for those
only, so AdamW's two moments cost ``1 / data_parallel_size`` of the replicated optimizer.
Gradients are still summed on every replica (the clipping norm needs them all); after the
step each owner broadcasts its updated parameters to the other replicas.

Whole tensors rather than megatron's flat buffer ranges keep every optimizer exact
(AdamW is elementwise, Muon orthogonalises whole matrices) and need only broadcasts, which
gloo has (megatron-core's ``DistributedOptimizer`` needs reduce-scatter over its own
gradient buffers). The split is decided identically on every replica from the sizes alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def partition_parameters(sizes: Sequence[int], parts: int) -> list[int]:
    """The owner (0..parts-1) of each parameter, balancing the total size per owner.

    Largest first, each to the least loaded owner (ties: the lowest); deterministic.
    """
    if parts > len(sizes):
        raise ValueError(
            f"the distributed optimizer splits {len(sizes)} parameters over {parts} data-"
            f"parallel ranks, which leaves a rank without any; use fewer data-parallel ranks "
            "or megatron.use_distributed_optimizer=false"
        )
    load = [0] * parts
    owners = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        owner = min(range(parts), key=lambda part: (load[part], part))
        owners[index] = owner
        load[owner] += sizes[index]
    return owners


class ParameterOwners:
    """Which data-parallel rank steps each parameter of this stage, and the sync after it."""

    def __init__(self, params: Sequence[torch.nn.Parameter]) -> None:
        self._group = parallel_state.get_data_parallel_group()
        self._ranks = dist.get_process_group_ranks(self._group)
        size = parallel_state.get_data_parallel_world_size()
        owners = partition_parameters([p.numel() for p in params], size)
        self.by_rank: list[list[torch.nn.Parameter]] = [[] for _ in range(size)]
        for param, owner in zip(params, owners, strict=True):
            self.by_rank[owner].append(param)
        self.mine = self.by_rank[parallel_state.get_data_parallel_rank()]

    @torch.no_grad()
    def broadcast(self) -> None:
        """Send every owner's updated parameters to the other replicas (collective).

        In buckets of at most :data:`BUCKET_ELEMENTS` elements of one dtype, so the
        transient buffer stays small next to the model.
        """
        for owner, params in enumerate(self.by_rank):
            for bucket in _buckets(params):
                flat = _flatten_dense_tensors([p.data for p in bucket])
                dist.broadcast(flat, src=self._ranks[owner], group=self._group)
                for param, value in zip(
                    bucket, _unflatten_dense_tensors(flat, bucket), strict=True
                ):
                    param.data.copy_(value)


BUCKET_ELEMENTS = 8 * 1024 * 1024
"""Largest broadcast of :meth:`ParameterOwners.broadcast` (one tensor may exceed it)."""


def _buckets(params: Sequence[torch.nn.Parameter]) -> list[list[torch.nn.Parameter]]:
    """``params`` in order, cut into runs of one dtype and at most BUCKET_ELEMENTS elements."""
    buckets: list[list[torch.nn.Parameter]] = []
    filled = 0
    for param in params:
        if (
            not buckets
            or buckets[-1][0].dtype != param.dtype
            or filled + param.numel() > BUCKET_ELEMENTS
        ):
            buckets.append([])
            filled = 0
        buckets[-1].append(param)
        filled += param.numel()
    return buckets
