"""DAPO's dynamic sampling: keep the prompt groups whose samples differ.

A group whose ``n`` samples all scored alike has zero advantage under a group baseline
(GRPO, RLOO): it adds nothing to the update. With ``algorithm.filter_groups`` the step
drops such groups and draws more prompt batches until ``data.train_batch_size`` groups
that differ are in hand (:func:`sample_varied_groups`), as DAPO does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from hf_algos.advantages.grouping import first_groups_rows, group_ids, varied_group_rows
from hf_algos.config.algorithm import FilterGroupsSection
from hf_algos.trainers.roles.batch_io import Metrics, tensors
from hf_protocol import DataProto, fields

logger = logging.getLogger(__name__)


def sequence_metric(batch: DataProto, metric: str) -> torch.Tensor:
    """Per-row value that dynamic sampling compares within a group, ``(B,)`` float.

    ``score``: ``token_level_scores`` summed over the response; any other name: that key of
    each row's ``reward_extra_info`` (what the scoring function returned besides the score).
    A sample whose scoring failed (status other than ``ok``, within
    ``reward.max_error_fraction``) has no such value and compares by its score instead; a
    sample scored ``ok`` without a value (absent or ``None``) is an error naming its row.
    """
    scores = tensors(batch)[fields.TOKEN_LEVEL_SCORES].sum(-1)
    if metric == "score":
        return scores
    infos = batch.non_tensor_batch.get(fields.REWARD_EXTRA_INFO)
    if infos is None or all(info.get(metric) is None for info in infos):
        known = sorted(infos[0]) if infos is not None and len(infos) else []
        raise KeyError(
            f"algorithm.filter_groups.metric={metric!r}: the reward gave no such value per "
            f"sample (reward_extra_info keys: {known}); use 'score' or have the scoring "
            f"function return {{'score': ..., {metric!r}: ...}}"
        )
    values = []
    for row, info in enumerate(infos):
        value = info.get(metric)
        if value is None and info.get("status", "ok") != "ok":
            value = float(scores[row])  # failed scoring: no extras, the fallback score stands
        if value is None:
            raise ValueError(
                f"algorithm.filter_groups.metric={metric!r}: row {row} was scored but its "
                f"{metric!r} is {value!r} (reward_extra_info: {info!r:.200}); have the scoring "
                f"function return a number for {metric!r} on every sample, or filter on 'score'"
            )
        values.append(float(value))
    return torch.tensor(values)


def keep_varied_groups(batch: DataProto, metric: str) -> tuple[DataProto, int, int]:
    """The rows of ``batch`` whose prompt group (``uid``) has differing ``metric`` values,
    with the numbers of groups kept and dropped."""
    ids = group_ids(batch.non_tensor_batch[fields.UID])
    keep = varied_group_rows(ids, sequence_metric(batch, metric))
    kept_groups = len(set(ids[keep].tolist()))
    total_groups = int(ids.max()) + 1 if len(ids) else 0
    return batch.select_idxs(keep.numpy()), kept_groups, total_groups - kept_groups


def first_groups(batch: DataProto, count: int) -> DataProto:
    """The rows of the first ``count`` prompt groups of ``batch`` (in order of appearance)."""
    ids = group_ids(batch.non_tensor_batch[fields.UID])
    return batch.select_idxs(first_groups_rows(ids, count).numpy())


def sample_varied_groups(
    first: DataProto,
    draw: Callable[[int], DataProto],
    spec: FilterGroupsSection,
    target: int,
    batches_per_epoch: int,
    step: int,
) -> tuple[DataProto, Metrics]:
    """Keep the varied groups of ``first`` (a generated and scored batch), calling
    ``draw(i)`` for the ``i``-th extra batch of the step until ``target`` varied groups are in
    hand (then trimmed to ``target``) or ``spec.max_num_gen_batches`` batches (default: one
    epoch, ``batches_per_epoch``) were drawn (then what there is, maybe nothing).

    Returns the batch and the ``filter_groups/*`` metrics (``kept_groups`` trained on,
    ``dropped_groups`` whose samples all scored alike, ``gen_batches`` drawn,
    ``short_of_target``).
    """
    limit = spec.max_num_gen_batches or batches_per_epoch
    batch, kept, dropped = keep_varied_groups(first, spec.metric)
    draws = 1
    while kept < target and draws < limit:
        more, more_kept, more_dropped = keep_varied_groups(draw(draws), spec.metric)
        # the parts' sampling configs differ by their seed only; nothing downstream reads it
        for part in (batch, more):
            part.meta_info.pop(fields.SAMPLING, None)
        batch = DataProto.concat([batch, more])
        kept, dropped, draws = kept + more_kept, dropped + more_dropped, draws + 1
    if 0 < kept < target:
        logger.warning(
            "step %d: %d prompt groups with differing %s after %d batches (target %d); "
            "training on those",
            step, kept, spec.metric, draws, target,
        )  # fmt: skip
    metrics = {
        "filter_groups/kept_groups": float(min(kept, target)),
        "filter_groups/dropped_groups": float(dropped),
        "filter_groups/gen_batches": float(draws),
        "filter_groups/short_of_target": float(kept < target),
    }
    return (first_groups(batch, target) if kept > target else batch), metrics
