"""Gathering DataProtos across the ranks of a ``torch.distributed`` process group."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tensordict import TensorDict

from hf_protocol.columns import tensor_columns
from hf_protocol.data_proto import DataProto


def _layout(data: DataProto) -> dict[str, Any]:
    """What every rank must agree on before tensors are exchanged."""
    columns = {}
    if data.batch is not None:
        columns = {
            k: (str(v.dtype), list(v.shape[1:])) for k, v in tensor_columns(data.batch).items()
        }
    return {
        "length": len(data),
        "has_batch": data.batch is not None,
        "columns": columns,
        "non_tensor_keys": sorted(data.non_tensor_batch),
    }


def _check_layouts(layouts: list[dict[str, Any]]) -> None:
    reference = {k: v for k, v in layouts[0].items() if k != "length"}
    for rank, layout in enumerate(layouts[1:], start=1):
        other = {k: v for k, v in layout.items() if k != "length"}
        if other != reference:
            raise ValueError(
                f"all_gather_data_proto: rank {rank} holds columns {other} but rank 0 holds "
                f"{reference}; every rank must pass the same keys, dtypes and trailing shapes."
            )


def _gather_tensor(
    tensor: torch.Tensor, lengths: list[int], group: dist.ProcessGroup | None, device: torch.device
) -> torch.Tensor:
    """All-gather rows of ``tensor`` when ranks hold different numbers of rows.

    Rows are padded to the longest rank and sent as raw bytes, so every dtype
    (bool, bfloat16 ...) travels on every backend.
    """
    longest = max(lengths)
    padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=device)
    padded[: len(tensor)] = tensor.to(device)
    as_bytes = (
        padded.reshape(longest, -1).view(torch.uint8)
        if padded.numel()
        else padded.view(torch.uint8)
    )
    outputs = [torch.empty_like(as_bytes) for _ in lengths]
    dist.all_gather(outputs, as_bytes.contiguous(), group=group)
    rows = [
        out.view(tensor.dtype).reshape(longest, *tensor.shape[1:])[:n]
        for out, n in zip(outputs, lengths, strict=True)
    ]
    return torch.cat(rows).to(tensor.device)


def all_gather_data_proto(
    data: DataProto, process_group: dist.ProcessGroup | None = None
) -> DataProto:
    """Replace ``data`` in place by the concatenation of every rank's ``data``, in rank order.

    Ranks may hold different numbers of rows. Column keys, dtypes and trailing
    shapes must match across ranks; when they do not, every rank raises the same
    error instead of hanging. Returns ``data`` for convenience.
    """
    world_size = dist.get_world_size(group=process_group)
    layouts: list[Any] = [None] * world_size
    dist.all_gather_object(layouts, _layout(data), group=process_group)
    _check_layouts(layouts)
    lengths = [layout["length"] for layout in layouts]

    if data.batch is not None:
        backend = dist.get_backend(process_group)
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )
        gathered = {
            k: _gather_tensor(v, lengths, process_group, device)
            for k, v in tensor_columns(data.batch).items()
        }
        data.batch = TensorDict(gathered, batch_size=[sum(lengths)], device=data.batch.device)

    non_tensors: list[Any] = [None] * world_size
    dist.all_gather_object(non_tensors, data.non_tensor_batch, group=process_group)
    data.non_tensor_batch = {
        key: np.concatenate([part[key] for part in non_tensors]) for key in data.non_tensor_batch
    }
    return data
