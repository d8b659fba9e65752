"""Reading a loss function's inputs from an engine micro-batch."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hf_protocol import DataProto, fields


def batch_field(micro_batch: DataProto, key: str, device: torch.device, why: str) -> torch.Tensor:
    """Tensor ``key`` of ``micro_batch`` on ``device``; the error says what produces it.

    ``why`` completes "... which <why>" in the message, e.g. "compute_advantage writes".
    """
    tensors = micro_batch.batch
    held = sorted(tensors.keys()) if tensors is not None else []
    if tensors is None or key not in held:
        raise KeyError(f"the micro-batch lacks {key!r}, which {why}; it holds {held}")
    return tensors[key].to(device)


def mini_batch_totals(micro_batch: DataProto) -> Mapping[str, float] | None:
    """The engine's mini-batch totals (``tokens``, ``sequences``) of ``micro_batch``, or
    ``None`` when the loss is called outside an engine."""
    totals = micro_batch.meta_info.get(fields.MINI_BATCH_TOTALS)
    return None if totals is None else dict(totals)
