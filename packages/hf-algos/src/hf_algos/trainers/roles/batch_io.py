"""What the driver sends to the worker groups and takes back from them.

Every trainer (PPO and its relatives, DPO, SFT) moves batches the same way: the fields a
worker reads (:func:`for_worker`), its output's columns and metrics folded back into the
driver's batch (:func:`absorb`), both at once (:func:`call_group`), the rollout call
(:func:`generate`) and, in the hybrid placement, the memory phases around it
(:func:`generation_phase`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from tensordict import TensorDict

from hf_algos.tracking import merge_worker_metrics, timed
from hf_algos.trainers.roles.groups import RoleGroups
from hf_algos.trainers.roles.protocols import RolloutGroup
from hf_protocol import DataProto, fields
from hf_rollout import SamplingConfig

Metrics = dict[str, float]

PROMPT_FIELDS = (fields.INPUT_IDS, fields.ATTENTION_MASK, fields.POSITION_IDS)
"""What a rollout reads of a prompt batch."""


MODEL_FIELDS = (*PROMPT_FIELDS, fields.RESPONSES, fields.RESPONSE_MASK)
"""What a forward pass over prompt + response reads."""


WORKER_META = (fields.TEMPERATURE, fields.OLD_LOG_PROBS_FROM_UPDATE)
"""The ``meta_info`` keys :func:`for_worker` passes on."""


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


def absorb(batch: DataProto | None, output: DataProto, metrics: Metrics) -> None:
    """Move a worker output's ``meta_info["metrics"]`` into ``metrics`` (averaged) and its
    columns into ``batch`` (when given)."""
    metrics.update(merge_worker_metrics([output]))
    output.meta_info.pop(fields.METRICS, None)
    output.meta_info.pop(fields.REWARD_ERRORS, None)
    if batch is not None:
        batch.union(output)


def call_group(
    method: Callable[[DataProto], DataProto],
    batch: DataProto,
    metrics: Metrics,
    keys: tuple[str, ...] = MODEL_FIELDS,
    keep_output: bool = True,
) -> None:
    """One worker-group call on ``batch``: ``method`` gets the fields of ``keys`` that the
    batch holds (:func:`for_worker`); its metrics go into ``metrics`` and, with
    ``keep_output``, its columns into ``batch`` (:func:`absorb`; an update's output has
    none)."""
    output = method(for_worker(batch, keys))
    absorb(batch if keep_output else None, output, metrics)


def rename_prefix(metrics: Metrics, old: str, new: str) -> None:
    """Rename the ``metrics`` whose names start with ``old`` to start with ``new`` instead
    (e.g. a worker's ``actor/rollout_correction/kl_k1`` to the driver's name)."""
    for name in [name for name in metrics if name.startswith(old)]:
        metrics[new + name[len(old) :]] = metrics.pop(name)


def generate(
    rollout: RolloutGroup, prompts: DataProto, sampling: SamplingConfig, metrics: Metrics
) -> DataProto:
    """Responses for ``prompts`` from the rollout group, sampled as ``sampling`` says (the
    object itself travels to the workers in ``meta_info["sampling"]``); the non-tensor
    columns ride along."""
    request = prompts.select(batch_keys=list(PROMPT_FIELDS))
    # each row's random stream follows its index here, not its worker: same samples on any
    # number of rollout workers
    tensors(request)[fields.PROMPT_INDEX] = torch.arange(len(prompts))
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


def response_ids(batch: TensorDict, row: int) -> list[int]:
    """The response token ids of ``row`` of a generated batch, padding dropped (the
    ``responses`` under ``response_mask``)."""
    return batch[fields.RESPONSES][row][batch[fields.RESPONSE_MASK][row].bool()].tolist()
