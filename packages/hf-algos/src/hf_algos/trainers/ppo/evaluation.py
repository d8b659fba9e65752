"""Validation: answers to the held-out prompts, scored, and their metrics.

Greedy answers give ``val/score/mean``, ``val/accuracy`` and ``val/<data_source>/score/mean``
(:func:`validation_metrics`); ``k`` sampled answers per prompt give mean@k, pass@k and maj@k
(:func:`sampled_validation_metrics`). :func:`generation_rows` turns answers into the rows
``trainer.log_val_generations`` logs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import torch

from hf_algos.data import RLDataset
from hf_algos.data.loader import all_batches
from hf_algos.tracking import Generation
from hf_algos.trainers.roles.batch_io import Metrics, generate, response_ids, tensors
from hf_algos.trainers.roles.protocols import RewardScorer, RolloutGroup
from hf_protocol import DataProto, fields
from hf_rollout import SamplingConfig


def score_validation(
    rollout: RolloutGroup,
    reward: RewardScorer,
    val_data: tuple[RLDataset, int],
    sampling: SamplingConfig,
    on_batch: Callable[[DataProto, torch.Tensor, DataProto], None] | None = None,
) -> tuple[torch.Tensor, np.ndarray]:
    """Answers to every validation prompt (``sampling.n`` each, in prompt order), scored:
    the ``(prompts * n,)`` scores and each answer's data source.

    ``on_batch(output, scores, scored)`` sees each generated batch, its ``(B,)`` scores and
    the reward's output (its ``reward_extra_info``), e.g. to keep sample generations (see
    :func:`generation_rows`) or the answers to vote on (:func:`vote_keys`).
    """
    scores: list[torch.Tensor] = []
    sources: list[np.ndarray] = []
    for prompts in all_batches(*val_data):
        output = generate(rollout, prompts, sampling, {})
        scored = reward.score(output)
        scores.append(tensors(scored)[fields.TOKEN_LEVEL_SCORES].sum(-1))
        sources.append(np.asarray(output.non_tensor_batch[fields.DATA_SOURCE]))
        if on_batch is not None:
            on_batch(output, scores[-1], scored)
    return torch.cat(scores), np.concatenate(sources)


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


def sampled_validation_metrics(
    scores: torch.Tensor, samples: int, answers: Sequence[str] | None = None
) -> Metrics:
    """Metrics of ``samples`` sampled answers per prompt (``scores`` ``(prompts * samples,)``,
    each prompt's answers together): ``val/sampled/score/mean``, ``val/sampled/accuracy``
    (mean@k: the share of right answers), ``val/sampled/pass@k`` (the share of prompts with
    at least one right answer among their k) and, given each sample's ``answers`` (the keys
    voted on, :func:`vote_keys`), ``val/sampled/maj@k`` (:func:`majority_vote_accuracy`)."""
    right = (scores >= 1.0).float().view(-1, samples)
    metrics = {
        "val/sampled/score/mean": float(scores.mean()),
        "val/sampled/accuracy": float(right.mean()),
        f"val/sampled/pass@{samples}": float(right.amax(dim=1).mean()),
    }
    if answers is not None:
        metrics[f"val/sampled/maj@{samples}"] = majority_vote_accuracy(scores, answers, samples)
    return metrics


def majority_vote_accuracy(scores: torch.Tensor, answers: Sequence[str], samples: int) -> float:
    """maj@k: the share of prompts whose most frequent answer among their ``samples`` is right.

    ``scores`` ``(prompts * samples,)`` and ``answers`` (one key per sample) hold each
    prompt's samples together. A tie goes to the answer given first; the voted answer is
    right when the first sample that gave it scored >= 1.
    """
    if len(answers) != len(scores) or len(scores) % samples:
        raise ValueError(
            f"{len(answers)} answers and {len(scores)} scores must both be prompts x "
            f"samples={samples}"
        )
    right = 0
    for start in range(0, len(answers), samples):
        group = list(answers[start : start + samples])
        counts = Counter(group)
        voted = max(group, key=lambda answer: counts[answer])  # max keeps the first of a tie
        right += int(scores[start + group.index(voted)] >= 1.0)
    return right / (len(answers) // samples)


def vote_keys(
    output: DataProto, scored: DataProto, decode: Callable[[list[int]], str]
) -> list[str]:
    """The answer each sample of a generated batch votes with in maj@k: the ``pred`` its
    reward function reported (verl's convention: a dict result with ``"pred"``), else its
    decoded response with surrounding whitespace dropped."""
    batch = tensors(output)
    extras = scored.non_tensor_batch.get(fields.REWARD_EXTRA_INFO)
    keys: list[str] = []
    for i in range(len(output)):
        info = extras[i] if extras is not None else None
        pred = info.get("pred") if isinstance(info, dict) else None
        if pred is None:
            ids = response_ids(batch, i)
            pred = decode(ids).strip()
        keys.append(str(pred))
    return keys


def generation_rows(
    output: DataProto, scores: torch.Tensor, decode: Callable[[list[int]], str], limit: int
) -> list[Generation]:
    """The first ``limit`` rows of a generated batch as loggable generations.

    ``output`` holds ``responses`` / ``response_mask`` ``(B, R)`` and the loader's
    non-tensor columns; ``scores`` is ``(B,)``. Each row: ``data_source``, ``prompt`` (the
    raw prompt; chat messages as JSON), ``response`` (decoded, padding dropped),
    ``ground_truth`` and ``score``.
    """
    batch, extra = tensors(output), output.non_tensor_batch
    rows: list[Generation] = []
    for i in range(min(limit, len(output))):
        ids = response_ids(batch, i)
        prompt = extra[fields.RAW_PROMPT][i] if fields.RAW_PROMPT in extra else ""
        truth = extra[fields.REWARD_MODEL][i] if fields.REWARD_MODEL in extra else None
        rows.append(
            {
                "data_source": str(extra[fields.DATA_SOURCE][i]),
                "prompt": prompt if isinstance(prompt, str) else json.dumps(prompt, default=str),
                "response": decode(ids),
                "ground_truth": str((truth or {}).get("ground_truth", "")),
                "score": float(scores[i]),
            }
        )
    return rows
