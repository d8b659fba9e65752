"""Scores from a reward-model worker group (``hf_engines.RewardModelWorker``)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from hf_algos.rewards.token_scores import response_mask_of
from hf_protocol import DataProto, fields

RM_INPUT_FIELDS: tuple[str, ...] = (
    fields.INPUT_IDS,
    fields.ATTENTION_MASK,
    fields.POSITION_IDS,
    fields.RESPONSES,
)
"""The tensors a reward-model worker reads; only these are sent to it."""


class RewardModelScorer:
    """Turns a reward-model group's ``rm_scores`` into ``token_level_scores``.

    ``worker_group`` is any group (Ray or local) of ``hf_engines.RewardModelWorker`` whose
    ``init_model`` has run. The output, like :class:`~hf_algos.rewards.RewardManager`'s, is a
    new DataProto to ``union`` into the batch: ``token_level_scores`` ``(B, R)`` float32 (the
    model's score on the last response token) and ``meta_info["metrics"]`` with
    ``reward/rm_score/mean``.
    """

    def __init__(self, worker_group: Any) -> None:
        if not hasattr(worker_group, "compute_rm_score"):
            raise TypeError(
                f"{type(worker_group).__name__} has no compute_rm_score method; pass a worker "
                f"group of hf_engines.RewardModelWorker"
            )
        self.worker_group = worker_group
        self._dispatcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-model")

    def score(self, batch: DataProto) -> DataProto:
        """Score ``batch`` (needs ``input_ids``, ``attention_mask``, ``position_ids``,
        ``responses``) and wait for the result."""
        mask = response_mask_of(batch)
        output = self.worker_group.compute_rm_score(batch.select(batch_keys=list(RM_INPUT_FIELDS)))
        if output.batch is None or "rm_scores" not in output.batch:
            raise KeyError("the reward-model group returned no 'rm_scores' tensor")
        scores = output.batch["rm_scores"].to(torch.float32) * mask.to(torch.float32)
        per_sample = scores.sum(dim=1)
        return DataProto.from_dict(
            tensors={fields.TOKEN_LEVEL_SCORES: scores},
            meta_info={fields.METRICS: {"reward/rm_score/mean": float(per_sample.mean())}},
        )

    def score_async(self, batch: DataProto) -> Future[DataProto]:
        """Start :meth:`score` in a background thread; batches run in submission order."""
        return self._dispatcher.submit(self.score, batch)

    def close(self) -> None:
        """Stop the background thread (the worker group is the caller's to shut down)."""
        self._dispatcher.shutdown(wait=True)
