"""The distributed optimizer (ZeRO-1): optimizer state split over data-parallel replicas.

``megatron.use_distributed_optimizer=True`` gives each data-parallel rank a share of the
stage's parameters (whole tensors, balanced by size): its optimizer holds state for those
only, so AdamW's two moments cost ``1 / data_parallel_size`` of the replicated optimizer.
Gradients are still summed on every replica (the clipping norm needs them all); after the
step each owner broadcasts its updated parameters to the other replicas.

With pipeline parallelism and tied embeddings the first and last stages each hold a copy
of the embeddings, updated identically; the distributed optimizer also splits that copy's
state between them (:class:`TiedEmbeddingHalves`: each stage steps half the rows and sends
them to the other), so neither stage keeps moments for the whole vocabulary.

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
from megatron.core.models.gpt import GPTModel
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


class TiedEmbeddingHalves:
    """The optimizer's view of a tied embedding copy: this pipeline end's half of the rows.

    The first stage steps rows ``[0, h)``, the last stage rows ``[h, V)`` of its (TP-local)
    copy; :meth:`finish` sends each half to the other end. Both copies' gradients are
    already summed over the two ends, so the result equals stepping the whole tensor.
    """

    def __init__(self, weight: torch.nn.Parameter) -> None:
        self.weight = weight
        self._group = parallel_state.get_embedding_group()
        self._ranks = dist.get_process_group_ranks(self._group)
        rows = weight.shape[0]
        self._spans = [(0, (rows + 1) // 2), ((rows + 1) // 2, rows)]
        self._mine = 0 if parallel_state.is_pipeline_first_stage() else 1
        self.param = torch.nn.Parameter(self._rows(self._mine))

    @classmethod
    def of(cls, model: GPTModel) -> TiedEmbeddingHalves | None:
        """The halves for ``model``'s stage, or None without a tied copy on two stages."""
        tied = model.share_embeddings_and_output_weights
        pipeline = parallel_state.get_pipeline_model_parallel_world_size() > 1
        if not (tied and pipeline and parallel_state.is_rank_in_embedding_group()):
            return None
        return cls(model.shared_embedding_or_output_weight())

    def _rows(self, span: int) -> torch.Tensor:
        start, stop = self._spans[span]
        return self.weight.data[start:stop]

    def prepare(self) -> None:
        """Point the optimizer's half at the weight's rows and their (reduced) gradient."""
        start, stop = self._spans[self._mine]
        self.param.data = self._rows(self._mine)  # re-linked: .to() may have moved the weight
        assert self.weight.grad is not None
        self.param.grad = self.weight.grad[start:stop]

    @torch.no_grad()
    def finish(self) -> None:
        """Exchange the updated halves between the two ends (collective over both)."""
        self.param.grad = None
        for span, owner in enumerate(self._ranks):
            dist.broadcast(self._rows(span), src=owner, group=self._group)


class DistributedOptimizer:
    """Which parameters this rank's optimizer steps, and the exchange that completes a step.

    Splits over data-parallel replicas (:class:`ParameterOwners`) and, with pipeline
    parallelism and tied embeddings, the embedding copies' rows over the two pipeline ends
    (:class:`TiedEmbeddingHalves`).
    """

    def __init__(self, model: GPTModel) -> None:
        self.tied = TiedEmbeddingHalves.of(model)
        params = [p for p in model.parameters() if p.requires_grad]
        if self.tied is not None:
            params = [self.tied.param if p is self.tied.weight else p for p in params]
        self.owners = ParameterOwners(params)
        self.params = self.owners.mine
        """The parameters for this rank's optimizer."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()`` on this rank's share, then the exchanges (collective)."""
        if self.tied is not None:
            self.tied.prepare()
        optimizer.step()
        self.owners.broadcast()
        if self.tied is not None:
            self.tied.finish()
