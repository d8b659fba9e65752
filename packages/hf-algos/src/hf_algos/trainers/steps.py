"""Step pieces shared by the trainers: worker-call plumbing, generation and its memory
phases, dynamic-sampling group filters, rollout correction, validation (greedy and sampled)."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from tensordict import TensorDict

from hf_algos.advantages.grouping import first_groups_rows, group_ids, varied_group_rows
from hf_algos.config.trainers import RLConfig
from hf_algos.data import RLDataset
from hf_algos.losses.rollout_correction import CorrectionSettings
from hf_algos.tracking import Generation, merge_worker_metrics, timed
from hf_algos.trainers import builders
from hf_algos.trainers.groups import RewardScorer, RolloutGroup
from hf_algos.trainers.roles import RoleGroups
from hf_protocol import DataProto, fields
from hf_rollout import SamplingConfig

Metrics = dict[str, float]

PROMPT_FIELDS = (fields.INPUT_IDS, fields.ATTENTION_MASK, fields.POSITION_IDS)
"""What a rollout reads of a prompt batch."""
MODEL_FIELDS = (*PROMPT_FIELDS, fields.RESPONSES, fields.RESPONSE_MASK)
"""What a forward pass over prompt + response reads."""
WORKER_META = (fields.TEMPERATURE, fields.OLD_LOG_PROBS_FROM_UPDATE)
"""The ``meta_info`` keys :func:`for_worker` passes on."""


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


@contextlib.contextmanager
def generation_phase(
    roles: RoleGroups, offload_actor: bool, timing: dict[str, float]
) -> Iterator[None]:
    """Memory phases of the hybrid placement around a ``with`` block that generates.

    Before: the actor's params and optimizer state go to CPU (when ``offload_actor``), then
    the rollout wakes up; after: the rollout sleeps (frees its KV cache, and its weights
    where the engine can), then the actor comes back. Timed as ``offload``, ``wake_up``,
    ``sleep`` and ``onload``. In the ``separate`` placement the rollout has its own
    processes, so there is nothing to hand over and the block just runs.
    """
    if not roles.fused:
        yield
        return
    if offload_actor:
        with timed("offload", timing):
            roles.actor.offload()
    with timed("wake_up", timing):
        roles.rollout.wake_up()
    yield  # no try/finally: after a failure the workers' memory state no longer matters
    with timed("sleep", timing):
        roles.rollout.sleep()
    if offload_actor:
        with timed("onload", timing):
            roles.actor.onload()


def sequence_metric(batch: DataProto, metric: str) -> torch.Tensor:
    """Per-row value that dynamic sampling compares within a group, ``(B,)`` float.

    ``score``: ``token_level_scores`` summed over the response; any other name: that key of
    each row's ``reward_extra_info`` (what the scoring function returned besides the score).
    """
    if metric == "score":
        return tensors(batch)[fields.TOKEN_LEVEL_SCORES].sum(-1)
    infos = batch.non_tensor_batch.get(fields.REWARD_EXTRA_INFO)
    if infos is None or any(metric not in info for info in infos):
        known = sorted(infos[0]) if infos is not None and len(infos) else []
        raise KeyError(
            f"algorithm.filter_groups.metric={metric!r}: the reward gave no such value per "
            f"sample (reward_extra_info keys: {known}); use 'score' or have the scoring "
            f"function return {{'score': ..., {metric!r}: ...}}"
        )
    return torch.tensor([float(info[metric]) for info in infos])


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


def response_ids(batch: TensorDict, row: int) -> list[int]:
    """The response token ids of ``row`` of a generated batch, padding dropped (the
    ``responses`` under ``response_mask``)."""
    return batch[fields.RESPONSES][row][batch[fields.RESPONSE_MASK][row].bool()].tolist()


def tensors(batch: DataProto) -> TensorDict:
    """``batch.batch`` (a TensorDict), which a rollout output always has."""
    assert batch.batch is not None, "the batch holds no tensors"
    return batch.batch


def for_worker(batch: DataProto, keys: tuple[str, ...] = MODEL_FIELDS) -> DataProto:
    """The tensors named in ``keys`` that ``batch`` holds, and its :data:`WORKER_META`: what
    a worker reads (the non-tensor columns stay in the driver)."""
    assert batch.batch is not None
    held = set(batch.batch.keys())
    meta = [key for key in WORKER_META if key in batch.meta_info]
    return batch.select(batch_keys=[f for f in keys if f in held], meta_info_keys=meta)


def apply_rollout_correction(batch: DataProto, settings: CorrectionSettings) -> Metrics:
    """Compare ``old_log_probs`` with ``rollout_log_probs`` over the whole step's batch:
    returns the ``rollout_correction/*`` metrics and, when ``settings.mode`` is not ``off``,
    writes the per-token ``rollout_is_weights`` the actor's policy loss multiplies by.

    Call it after ``old_log_probs`` are in the batch (recomputed by the actor), with the
    settings of the run's async mode (``RolloutCorrectionSection.settings``). A batch
    without ``rollout_log_probs`` has nothing to compare: no metrics, and an error when a
    correction is asked for.
    """
    if not has_rollout_log_probs(batch):
        check_rollout_log_probs(settings, present=False)
        return {}
    data = tensors(batch)
    correction = settings.apply(
        data[fields.OLD_LOG_PROBS], data[fields.ROLLOUT_LOG_PROBS], data[fields.RESPONSE_MASK]
    )
    if settings.enabled:
        data[fields.ROLLOUT_IS_WEIGHTS] = correction.weights
    return correction.metrics


def check_rollout_log_probs(settings: CorrectionSettings, present: bool) -> None:
    """Refuse a correction (``tis`` / ``mis``) when the rollout wrote no log-probs."""
    if settings.enabled and not present:
        raise KeyError(
            f"algorithm.rollout_correction.mode={settings.mode!r} needs the rollout's "
            f"'{fields.ROLLOUT_LOG_PROBS}' in the batch, and this rollout wrote none; use "
            "a rollout backend that returns log-probs or set the mode to off"
        )


def old_log_probs_from_update(config: RLConfig, rows: int) -> bool:
    """Whether a step of ``rows`` rows takes ``old_log_probs`` from the actor's update.

    When the update is exactly one optimizer step over the whole batch (``ppo_epochs=1``
    and ``ppo_mini_batch_size >= rows``), the log-probs a separate no-grad forward would
    compute equal that step's own forward, detached: the driver skips the forward
    (``actor.old_log_probs_from_update``, on by default). Not when they come from the
    rollout (``actor.use_rollout_log_probs``) or are needed before the update (the reward's
    KL penalty, ``algorithm.use_kl_in_reward``).
    """
    actor = config.actor
    return (
        actor.old_log_probs_from_update
        and not actor.use_rollout_log_probs
        and not config.algorithm.use_kl_in_reward
        and actor.ppo_epochs == 1
        and rows <= actor.ppo_mini_batch_size
    )


def has_rollout_log_probs(batch: DataProto) -> bool:
    """Whether the rollout wrote its own log-probs into ``batch``."""
    return batch.batch is not None and fields.ROLLOUT_LOG_PROBS in batch.batch


def rename_prefix(metrics: Metrics, old: str, new: str) -> None:
    """Rename the ``metrics`` whose names start with ``old`` to start with ``new`` instead
    (e.g. a worker's ``actor/rollout_correction/kl_k1`` to the driver's name)."""
    for name in [name for name in metrics if name.startswith(old)]:
        metrics[new + name[len(old) :]] = metrics.pop(name)


def absorb(batch: DataProto | None, output: DataProto, metrics: Metrics) -> None:
    """Move a worker output's ``meta_info["metrics"]`` into ``metrics`` (averaged) and its
    columns into ``batch`` (when given)."""
    metrics.update(merge_worker_metrics([output]))
    output.meta_info.pop(fields.METRICS, None)
    output.meta_info.pop(fields.REWARD_ERRORS, None)
    if batch is not None:
        batch.union(output)


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
    for prompts in builders.all_batches(*val_data):
        output = generate(rollout, prompts, sampling, {})
        scored = reward.score(output)
        scores.append(tensors(scored)[fields.TOKEN_LEVEL_SCORES].sum(-1))
        sources.append(np.asarray(output.non_tensor_batch[fields.DATA_SOURCE]))
        if on_batch is not None:
            on_batch(output, scores[-1], scored)
    return torch.cat(scores), np.concatenate(sources)


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
