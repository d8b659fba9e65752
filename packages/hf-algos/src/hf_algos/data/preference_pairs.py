"""Online DPO pairs: the best and the worst scored response of each prompt group.

:func:`make_preference_batch` rearranges a scored rollout batch into the DPO batch
convention of :mod:`hf_algos.losses.dpo`: pair ``k`` at rows ``2k`` (chosen) and ``2k + 1``
(rejected).
"""

from __future__ import annotations

import numpy as np
import torch

from hf_algos.advantages.estimators import GroupIndex
from hf_algos.advantages.grouping import group_ids
from hf_algos.losses.inputs import batch_field
from hf_protocol import DataProto, fields


def build_preference_pairs(
    scores: torch.Tensor, index: GroupIndex, min_margin: float = 0.0
) -> list[tuple[int, int]]:
    """Pair the best and the worst response of each prompt group for online DPO.

    Shape: ``scores`` ``(B,)`` (one score per response row), ``index`` ``B`` group labels
    (the ``uid``). Returns ``(chosen_row, rejected_row)`` per group, in order of first
    appearance; ties go to the earlier row. Groups of one, and groups whose best and worst
    scores differ by no more than ``min_margin``, give no pair (no preference to learn).
    """
    ids = group_ids(index)
    if len(ids) != len(scores):
        raise ValueError(f"{len(ids)} group labels for {len(scores)} scores; give one per row")
    values = scores.detach().cpu().tolist()
    best: dict[int, int] = {}
    worst: dict[int, int] = {}
    for row, group in enumerate(ids.tolist()):
        if group not in best or values[row] > values[best[group]]:
            best[group] = row
        if group not in worst or values[row] < values[worst[group]]:
            worst[group] = row
    return [
        (best[group], worst[group])
        for group in best
        if values[best[group]] - values[worst[group]] > min_margin
    ]


def make_preference_batch(
    data: DataProto, scores: torch.Tensor | None = None, min_margin: float = 0.0
) -> DataProto:
    """The rows of ``data`` rearranged into adjacent (chosen, rejected) pairs.

    ``scores`` ``(B,)`` defaults to the sum of ``token_level_scores``; groups come from the
    non-tensor ``uid`` column. The result has ``2 * pairs`` rows and every column of
    ``data``; it may be empty when no group shows a preference.
    """
    if scores is None:
        cpu = torch.device("cpu")
        scores = batch_field(data, fields.TOKEN_LEVEL_SCORES, cpu, "scoring writes")
        scores = scores.sum(-1)
    if fields.UID not in data.non_tensor_batch:
        raise KeyError("make_preference_batch groups responses by the non-tensor 'uid' column")
    pairs = build_preference_pairs(scores, data.non_tensor_batch[fields.UID], min_margin)
    rows = np.array([row for pair in pairs for row in pair], dtype=np.int64)
    return data.select_idxs(rows)
