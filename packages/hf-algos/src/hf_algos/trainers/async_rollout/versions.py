"""Pure pieces of the async modes: policy versions per token, staleness, partial-rollout spans.

A *policy version* counts the actor updates whose weights a rollout engine holds: the
initial weights are version 0, the weights pushed after step ``k``'s update version ``k``.
Every response token records the version that sampled it
(:data:`hf_protocol.fields.ROLLOUT_POLICY_VERSION`); a sample's *lag* at a trainer version
``v`` is ``v`` minus the oldest version among its tokens. The driver in
:mod:`hf_algos.trainers.async_rollout.pipeline` uses these; they touch no worker.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch

from hf_algos.advantages.grouping import group_ids
from hf_protocol import DataProto, fields

Metrics = dict[str, float]


def stamp_versions(batch: DataProto, version: int) -> None:
    """Write ``rollout_policy_version`` ``(B, R)`` int64 = ``version`` into a generated batch
    (``responses`` ``(B, R)``), unless the rollout reported it: a ``RolloutWorker`` stamps
    the version its weight channel delivered (the ground truth), and that is kept."""
    assert batch.batch is not None
    if fields.ROLLOUT_POLICY_VERSION in batch.batch:
        return
    responses = batch.batch[fields.RESPONSES]
    batch.batch[fields.ROLLOUT_POLICY_VERSION] = torch.full_like(
        responses, version, dtype=torch.long
    )


def sample_lags(versions: torch.Tensor, response_mask: torch.Tensor, version: int) -> torch.Tensor:
    """Lag of each sample behind trainer ``version``: ``version - min(versions)`` over its
    response tokens; a sample with no response token lags by ``version - versions[:, 0]``.

    Shapes: ``versions`` ``(B, R)`` int64, ``response_mask`` ``(B, R)`` 0/1 -> ``(B,)`` int64.
    """
    oldest = _masked_extreme(versions, response_mask, largest=False)
    oldest = torch.where(response_mask.bool().any(dim=-1), oldest, versions[:, 0].long())
    return version - oldest


def _masked_extreme(versions: torch.Tensor, mask: torch.Tensor, largest: bool) -> torch.Tensor:
    """Per row, the max (``largest``) or min of ``versions`` ``(B, R)`` over the tokens of
    ``mask`` ``(B, R)`` -> ``(B,)`` int64; a row without tokens gives the sentinel
    (-1 for the max, the int64 max for the min)."""
    sentinel = -1 if largest else torch.iinfo(torch.long).max
    filled = torch.where(mask.bool(), versions.long(), torch.full_like(versions, sentinel))
    return filled.max(dim=-1).values if largest else filled.min(dim=-1).values


def stale_rows(uids: np.ndarray, lags: torch.Tensor, max_staleness: int) -> np.ndarray:
    """Rows to drop, ``(B,)`` bool: every row of a prompt group (``uid``) in which some sample
    lags by more than ``max_staleness`` (group estimators need the whole group)."""
    ids = group_ids(uids)
    stale_groups = set(ids[(lags > max_staleness).numpy()].tolist())
    return np.isin(ids.numpy(), sorted(stale_groups))


def staleness_metrics(lags: torch.Tensor) -> Metrics:
    """``async/staleness/mean|max`` and ``async/staleness_hist/<lag>`` (samples per lag) of
    the lags ``(B,)`` trained on this step."""
    if len(lags) == 0:
        return {}
    metrics = {
        "async/staleness/mean": float(lags.float().mean()),
        "async/staleness/max": float(lags.max()),
    }
    for lag, count in sorted(Counter(lags.tolist()).items()):
        metrics[f"async/staleness_hist/{lag}"] = float(count)
    return metrics


def mixed_version_rows(versions: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Samples whose response tokens come from more than one policy version (a partial
    rollout continued after a push), ``(B,)`` bool; ``versions`` / ``response_mask`` ``(B, R)``."""
    low = _masked_extreme(versions, response_mask, largest=False)
    high = _masked_extreme(versions, response_mask, largest=True)
    return response_mask.bool().any(dim=-1) & (high > low)


def to_plain(batch: DataProto) -> dict[str, Any]:
    """``batch`` as tensors, lists and plain values only: what a checkpoint's driver state
    may hold (they load with ``weights_only=True``). :func:`from_plain` reverses it."""
    tensors = {} if batch.batch is None else {str(k): batch.batch[k] for k in batch.batch.keys()}  # noqa: SIM118
    columns = {k: list(v) for k, v in batch.non_tensor_batch.items()}
    return {"tensors": tensors, "non_tensors": columns, "meta_info": dict(batch.meta_info)}


def from_plain(state: dict[str, Any]) -> DataProto:
    """The :class:`DataProto` that :func:`to_plain` wrote."""
    columns = {}
    for key, values in state["non_tensors"].items():
        column = np.empty(len(values), dtype=object)  # lists stay one entry per row
        for index, value in enumerate(values):
            column[index] = value
        columns[key] = column
    return DataProto.from_dict(state["tensors"], columns, state["meta_info"])


def response_lengths(batch: DataProto) -> torch.Tensor:
    """Response tokens of each row, ``(B,)`` int64 (``response_mask`` summed)."""
    assert batch.batch is not None
    return batch.batch[fields.RESPONSE_MASK].sum(dim=-1).long()


def unfinished_rows(
    chunk: DataProto, chunk_tokens: int, remaining: torch.Tensor, stop_ids: tuple[int, ...]
) -> torch.Tensor:
    """Rows of a generated chunk that must continue, ``(B,)`` bool: the chunk used all of its
    ``chunk_tokens`` (or ``remaining`` ``(B,)`` budget, if smaller) without a stop token at
    its end, and budget is left after it."""
    assert chunk.batch is not None
    lengths = response_lengths(chunk)
    cap = torch.clamp(remaining, max=chunk_tokens)
    responses = chunk.batch[fields.RESPONSES]
    last = responses.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    stopped = torch.tensor([int(t) in stop_ids for t in last.tolist()], dtype=torch.bool)
    return (lengths >= cap) & ~stopped & (remaining - lengths > 0)


def join_spans(
    spans: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], width: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sample's response from its spans, right-padded to ``width``.

    Each span is ``(ids, log_probs, version)`` with ``ids`` / ``log_probs`` ``(L_i,)`` (the
    span's response tokens, no padding) and ``version`` a 0-d int64 tensor. Returns
    ``responses`` ``(width,)`` int64 (pad ``pad_id``), ``response_mask`` ``(width,)`` int64,
    ``rollout_log_probs`` ``(width,)`` float32 (0 on pads) and ``rollout_policy_version``
    ``(width,)`` int64 (the last span's version on pads).
    """
    ids = torch.cat([s[0].long() for s in spans])[:width]
    log_probs = torch.cat([s[1].float() for s in spans])[:width]
    versions = torch.cat([torch.full((len(s[0]),), int(s[2])) for s in spans])[:width]
    length = len(ids)
    responses = torch.full((width,), pad_id, dtype=torch.long)
    responses[:length] = ids
    mask = torch.zeros(width, dtype=torch.long)
    mask[:length] = 1
    out_log_probs = torch.zeros(width, dtype=torch.float32)
    out_log_probs[:length] = log_probs
    out_versions = torch.full((width,), int(spans[-1][2]), dtype=torch.long)
    out_versions[:length] = versions
    return responses, mask, out_log_probs, out_versions
