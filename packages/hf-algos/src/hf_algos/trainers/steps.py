"""Step pieces shared by the trainers: worker-call plumbing, generation, greedy validation."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from hf_algos.data import RLDataset
from hf_algos.tracking import merge_worker_metrics
from hf_algos.trainers import builders
from hf_algos.trainers.groups import RewardScorer, RolloutGroup
from hf_protocol import DataProto, fields
from hf_rollout import SamplingConfig

Metrics = dict[str, float]

PROMPT_FIELDS = (fields.INPUT_IDS, fields.ATTENTION_MASK, fields.POSITION_IDS)
"""What a rollout reads of a prompt batch."""
MODEL_FIELDS = (*PROMPT_FIELDS, fields.RESPONSES, fields.RESPONSE_MASK)
"""What a forward pass over prompt + response reads."""


def generate(
    rollout: RolloutGroup, prompts: DataProto, sampling: SamplingConfig, metrics: Metrics
) -> DataProto:
    """Responses for ``prompts`` from the rollout group, sampled as ``sampling`` says (the
    object itself travels to the workers in ``meta_info["sampling"]``); the non-tensor
    columns ride along."""
    request = prompts.select(batch_keys=list(PROMPT_FIELDS))
    request.non_tensor_batch = dict(prompts.non_tensor_batch)
    request.meta_info = {fields.SAMPLING: sampling}
    output = rollout.generate_sequences(request)
    absorb(None, output, metrics)
    return output


def tensors(batch: DataProto) -> TensorDict:
    """``batch.batch`` (a TensorDict), which a rollout output always has."""
    assert batch.batch is not None, "the batch holds no tensors"
    return batch.batch


def for_worker(batch: DataProto, keys: tuple[str, ...] = MODEL_FIELDS) -> DataProto:
    """The tensors named in ``keys`` that ``batch`` holds, and its temperature: what a worker
    reads (the non-tensor columns stay in the driver)."""
    assert batch.batch is not None
    held = set(batch.batch.keys())
    meta = [key for key in (fields.TEMPERATURE,) if key in batch.meta_info]
    return batch.select(batch_keys=[f for f in keys if f in held], meta_info_keys=meta)


def absorb(batch: DataProto | None, output: DataProto, metrics: Metrics) -> None:
    """Move a worker output's ``meta_info["metrics"]`` into ``metrics`` (averaged) and its
    columns into ``batch`` (when given)."""
    metrics.update(merge_worker_metrics([output]))
    output.meta_info.pop(fields.METRICS, None)
    output.meta_info.pop(fields.REWARD_ERRORS, None)
    if batch is not None:
        batch.union(output)


def greedy_validation(
    rollout: RolloutGroup,
    reward: RewardScorer,
    val_data: tuple[RLDataset, int],
    sampling: SamplingConfig,
) -> Metrics:
    """Greedy answers to every validation prompt, scored: ``val/score/mean``,
    ``val/accuracy`` and ``val/<data_source>/score/mean``."""
    scores: list[torch.Tensor] = []
    sources: list[np.ndarray] = []
    for prompts in builders.all_batches(*val_data):
        output = generate(rollout, prompts, sampling, {})
        scored = reward.score(output)
        scores.append(tensors(scored)[fields.TOKEN_LEVEL_SCORES].sum(-1))
        sources.append(np.asarray(output.non_tensor_batch[fields.DATA_SOURCE]))
    return validation_metrics(torch.cat(scores), np.concatenate(sources))


def validation_metrics(scores: torch.Tensor, sources: np.ndarray) -> Metrics:
    """Mean score, accuracy (share of scores >= 1) overall and per data source."""
    metrics = {
        "val/score/mean": float(scores.mean()),
        "val/accuracy": float((scores >= 1.0).float().mean()),
    }
    for source in sorted(set(sources.tolist())):
        selected = scores[torch.from_numpy(sources == source)]
        metrics[f"val/{source}/score/mean"] = float(selected.mean())
    return metrics
