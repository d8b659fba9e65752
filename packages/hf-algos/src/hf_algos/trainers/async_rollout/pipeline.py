"""The async modes' generation pipeline: generations queued ahead of the trainer (driver side).

``trainer.async_mode`` is a driver pattern, not threads in workers. The driver keeps
``queue_size`` non-blocking ``generate_sequences`` calls queued on the rollout group (a Ray actor
runs its calls in submission order, so the rollout never waits for the driver); each step
takes the oldest finished batch (FIFO, so the prompts trained on follow the loader's order)::

    batch = oldest generation (wait for it)      # async/wait_s
    push the actor's weights, if due             # queued on the rollout after its calls
    drop prompt groups lagging > max_staleness,  # async/stale_dropped
        generate them again with the new weights
    queue the next loader batches up to queue_size  # generated while the actor trains
    return batch                                 # -> score, log-probs, advantages, update

``one_step_off`` is a queue of 1 and a push every step (batch t+1 is generated with the weights
of step t-1 while the actor trains on batch t: every sample lags by exactly one version);
``fully_async`` queues ``trainer.queue_size``, a push every ``trainer.weight_push_every``
steps and the staleness bound ``trainer.max_staleness``; with ``rollout.partial`` each
generation is a chain of chunk calls continued with whatever weights the rollout holds
(:class:`~hf_algos.trainers.async_rollout.partial.PartialGeneration`). Every sample carries the
version of each token (``rollout_policy_version``).

A rollout worker that dies or misses its deadline is replaced when a
:class:`~hf_algos.trainers.roles.self_healing.RolloutReplacement` is given: the new group
holds the actor's current weights, samples already finished are kept, and every unfinished
generation (a partial one from its first chunk) is generated again on it.

:meth:`AsyncRollout.state_dict` holds what is in flight (finished samples, the prompts of
unfinished generations, counters): saved with the trainer's checkpoint and the loader
position, a resumed run neither skips nor repeats a prompt.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from hf_algos.tracking import merge_worker_metrics
from hf_algos.trainers.async_rollout.partial import PartialGeneration
from hf_algos.trainers.async_rollout.versions import (
    from_plain,
    mixed_version_rows,
    sample_lags,
    stale_rows,
    staleness_metrics,
    stamp_versions,
    to_plain,
)
from hf_algos.trainers.roles.batch_io import PROMPT_FIELDS, tensors
from hf_algos.trainers.roles.groups import RoleGroups
from hf_controller import WorkerGroupError, wait_any
from hf_protocol import DataProto, fields
from hf_rollout import SamplingConfig
from hf_rollout.base import stop_ids_for
from hf_rollout.weight_sync import WeightPush

Metrics = dict[str, float]
T = TypeVar("T")


@dataclass(frozen=True)
class AsyncSpec:
    """How far generation runs ahead (see the module docstring)."""

    queue_size: int
    """Generations queued ahead of the trainer (``trainer.queue_size``)."""
    weight_push_every: int
    """Push weights every this many steps (``trainer.weight_push_every``)."""
    max_staleness: int | None
    """Drop prompt groups lagging by more versions than this; ``None``: keep all."""
    partial_chunk_tokens: int | None = None
    """Partial rollout: new tokens per call; ``None``: one call per generation (the response
    budget and the stop tokens are the step's sampling config's)."""
    pad_id: int = 0
    """Pad id of prompts and responses (partial rollout)."""


@dataclass(frozen=True)
class GeneratedSamples:
    """What an async step trains on: samples the pipeline generated ahead (not prompts),
    with the pipeline's ``async/*`` metrics."""

    batch: DataProto
    """The samples, ``rollout.n`` per prompt, not yet scored."""
    metrics: dict[str, float]
    """``async/*``: wait, staleness, queue depth, policy and rollout versions."""

    @property
    def waited_s(self) -> float:
        """How long the trainer waited for them (``async/wait_s``)."""
        return self.metrics.get("async/wait_s", 0.0)


@dataclass
class GenerationJob:
    """One loader batch on its way through the rollout."""

    index: int
    """The step that trains on it (1-based): also its sampling seed."""
    prompts: DataProto
    """The loader batch."""
    handles: list[Any] | None = None
    """Per-rank handles of the call in flight."""
    version: int = 0
    """Policy version the rollout holds for the call in flight."""
    output: DataProto | None = None
    """The finished samples (with ``rollout_policy_version``)."""
    partial: PartialGeneration | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    """The rollout's ``meta_info["metrics"]`` of each call."""


class AsyncRollout:
    """Generation queued ahead of a PPO-family trainer (see the module docstring).

    ``roles`` are the run's groups (a restart rebuilds them in place); ``draw`` the next
    loader batch; ``sampling(index, draw)`` the sampling of a step's generation (its
    ``draw``-th, for regenerated groups); ``total_steps`` the run's last step. A failed
    rollout group is replaced by ``roles.recovery`` (within its bound).
    """

    def __init__(
        self,
        spec: AsyncSpec,
        roles: RoleGroups,
        draw: Callable[[], DataProto],
        sampling: Callable[[int, int], SamplingConfig],
        total_steps: int,
    ) -> None:
        self.spec = spec
        self.policy_version = 0  # the trainer's, as of the last next_batch / sync
        self._roles, self._draw, self._sampling, self._total = roles, draw, sampling, total_steps
        self.queue: deque[GenerationJob] = deque()
        self.issued = 0  # loader batches drawn into jobs
        self.rollout_version = 0  # policy version of the rollout's weights (after its queue)
        self.stale_dropped_total = 0
        self._push: WeightPush | None = None  # the push in flight

    # ------------------------------------------------------------------ the step

    def next_batch(self, version: int) -> GeneratedSamples:
        """The oldest generation's samples for the trainer at policy ``version``, stale
        groups generated again, and the ``async/*`` metrics; keeps ``queue_size`` queued."""
        start = time.perf_counter()
        self.policy_version = version
        self._guarded(self._fill)
        job = self.queue.popleft()
        batch = self._guarded(lambda: self._finish(job), job)
        metrics: Metrics = {}
        self._guarded(self._wait_push)
        if version - self.rollout_version >= self.spec.weight_push_every:
            self._guarded(lambda: self._start_push(version))
        batch = self._replace_stale(job, batch, version, metrics)
        self._guarded(self._fill)
        metrics["async/wait_s"] = time.perf_counter() - start  # the trainer's time without data
        data = tensors(batch)
        lags = sample_lags(data[fields.ROLLOUT_POLICY_VERSION], data[fields.RESPONSE_MASK], version)
        metrics.update(staleness_metrics(lags))
        mixed = mixed_version_rows(data[fields.ROLLOUT_POLICY_VERSION], data[fields.RESPONSE_MASK])
        metrics["async/mixed_version_samples"] = float(mixed.sum())
        metrics.update(merge_worker_metrics(job.metrics))
        metrics["async/queue_depth"] = float(len(self.queue))
        metrics["async/policy_version"] = float(version)
        metrics["async/rollout_version"] = float(self.rollout_version)
        metrics["async/stale_dropped_total"] = float(self.stale_dropped_total)
        return GeneratedSamples(batch, metrics)

    def sync(self, version: int) -> None:
        """Bring the rollout to policy ``version`` now (before validation), waiting for it."""
        self.policy_version = version
        self._guarded(self._wait_push)
        if self.rollout_version < version:
            self._guarded(lambda: self._start_push(version))
        self._guarded(self._wait_push)

    # ------------------------------------------------------------------ failures

    def _guarded(self, call: Callable[[], T], *current: GenerationJob) -> T:
        """``call()``; after a rollout failure, the rollout replaced (``roles.recovery``),
        every unfinished generation (``current`` and the queue's) reset, and ``call()``
        again. Anything else, or a failure past the bound, is raised."""
        while True:
            try:
                return call()
            except WorkerGroupError as error:
                # raises unless the rollout was replaced (with the actor's current weights)
                self._roles.recovery.replace(error, self.policy_version)
                self._push = None  # abandoned with the old group
                self.rollout_version = self.policy_version  # the actor's current weights
                for job in (*current, *self.queue):
                    if job.output is None:  # its samples died with the old group
                        job.handles, job.partial = None, None

    # ------------------------------------------------------------------ generation

    def _fill(self) -> None:
        """Issue jobs restored without a call, then new ones up to ``depth`` (and the run's
        last step)."""
        for job in self.queue:
            if job.output is None and job.handles is None:
                self._issue(job)
        while len(self.queue) < self.spec.queue_size and self.issued < self._total:
            self.issued += 1
            job = GenerationJob(self.issued, self._draw())
            self.queue.append(job)  # first: a failed issue leaves it queued, issued again
            self._issue(job)

    def _issue(self, job: GenerationJob) -> None:
        sampling, spec = self._sampling(job.index, 0), self.spec
        if spec.partial_chunk_tokens is not None:
            budget, stops = sampling.max_new_tokens, tuple(stop_ids_for(sampling))
            chunk = min(spec.partial_chunk_tokens, budget)
            job.partial = PartialGeneration(budget, chunk, stops, spec.pad_id)
            sampling = dataclasses.replace(sampling, max_new_tokens=chunk)
        self._submit(job, job.prompts, sampling)

    def _submit(self, job: GenerationJob, prompts: DataProto, sampling: SamplingConfig) -> None:
        rollout = self._roles.rollout
        request = prompts.select(batch_keys=list(PROMPT_FIELDS))
        request.non_tensor_batch = dict(prompts.non_tensor_batch)
        request.meta_info = {fields.SAMPLING: sampling}
        parts = request.chunk(rollout.world_size)
        job.handles = rollout.execute_all_async("generate_sequences", parts)
        job.version = self.rollout_version

    def _collect(self, job: GenerationJob) -> DataProto:
        """The finished call's output (metrics kept on the job, sampling dropped)."""
        assert job.handles is not None
        outputs = self._roles.rollout.wait_results("generate_sequences", job.handles)
        job.handles = None
        for output in outputs:
            job.metrics.append(output.meta_info.pop(fields.METRICS, {}))
            output.meta_info.pop(fields.SAMPLING, None)
        return DataProto.concat(outputs)

    def _advance(self, job: GenerationJob) -> None:
        """Handle ``job``'s finished call: store the samples, or continue a partial one."""
        output = self._collect(job)
        if job.partial is None:
            stamp_versions(output, job.version)
            job.output = output
            return
        job.partial.add(output, job.version)
        if job.partial.done:
            job.output = job.partial.result()
            return
        request, new_tokens = job.partial.next_request()
        first = self._sampling(job.index, 0)
        seed = (first.seed or 0) + 104_729 * job.partial.chunks  # each chunk draws afresh
        sampling = dataclasses.replace(first, n=1, max_new_tokens=new_tokens, seed=seed)
        self._submit(job, request, sampling)

    def _advance_running(self, job: GenerationJob) -> None:
        """:meth:`_advance` while ``job`` has a call (a replacement leaves it none)."""
        if job.handles:
            self._advance(job)

    def _finish(self, job: GenerationJob) -> DataProto:
        """Wait for ``job``'s samples; meanwhile continue any other job whose chunk ends, so
        the rollout's queue never runs dry."""
        while job.output is None:
            if job.handles is None:
                self._issue(job)
            pending = {h: j for j in (job, *self.queue) if j.handles for h in j.handles}
            ready = wait_any(list(pending))
            self._advance(pending[ready[0]])
        return job.output

    def _replace_stale(
        self, job: GenerationJob, batch: DataProto, version: int, metrics: Metrics
    ) -> DataProto:
        """Drop prompt groups lagging by more than ``max_staleness`` and generate their
        prompts again (one call, the newest weights), so no prompt is lost."""
        limit = self.spec.max_staleness
        data = tensors(batch)
        lags = sample_lags(data[fields.ROLLOUT_POLICY_VERSION], data[fields.RESPONSE_MASK], version)
        drop = (
            stale_rows(batch.non_tensor_batch[fields.UID], lags, limit)
            if limit is not None
            else None
        )
        metrics["async/stale_dropped"] = float(drop.sum()) if drop is not None else 0.0
        if drop is None or not drop.any():
            return batch
        self.stale_dropped_total += int(drop.sum())
        if self.rollout_version < version:  # regenerate with the trainer's weights
            self._guarded(self._wait_push)
            self._guarded(lambda: self._start_push(version))
        stale_uids = set(batch.non_tensor_batch[fields.UID][drop].tolist())
        prompt_uids = job.prompts.non_tensor_batch[fields.UID]
        prompts = job.prompts.select_idxs(np.array([u in stale_uids for u in prompt_uids]))
        again = GenerationJob(job.index, prompts)
        fresh = self._guarded(lambda: self._generate_now(again))
        stamp_versions(fresh, again.version)
        job.metrics.extend(again.metrics)
        return DataProto.concat([batch.select_idxs(~drop), fresh])

    def _generate_now(self, job: GenerationJob) -> DataProto:
        """``job``'s samples from one call, waited for (stale groups generated again)."""
        self._submit(job, job.prompts, self._sampling(job.index, 1))
        return self._collect(job)

    # ------------------------------------------------------------------ weights

    def _start_push(self, version: int) -> None:
        """Stream the actor's weights to the rollout, non-blocking: the rollout loads them
        after the calls already queued on it, so later calls use ``version``.

        The send is buffered: the actor snapshots its weights and goes on to the next
        training call while the rollout still generates the calls queued before the push;
        the snapshot is taken before that call, so the rollout gets exactly ``version``: the
        push carries it, and the rollout reports it with each sample it generates."""
        self._push = self._roles.weights.start_push(buffered=True, version=version)
        self.rollout_version = version

    def _wait_push(self) -> None:
        push, self._push = self._push, None
        if push is not None:
            push.wait()

    # ------------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        """What is in flight: each queued job's prompts and, if finished, its samples; the
        number of loader batches drawn and the staleness counters (tensors and plain data,
        as checkpoints load with ``weights_only=True``). A rollout worker found dead here
        is replaced, as on any other rollout call (its unfinished jobs are saved as
        prompts, generated again)."""
        for job in self.queue:  # take what has finished; the rest is generated again
            while job.handles and len(wait_any(job.handles, timeout_s=0)) == len(job.handles):
                self._guarded(functools.partial(self._advance_running, job), job)
        jobs = [
            {
                "index": j.index,
                "prompts": to_plain(j.prompts),
                "output": None if j.output is None else to_plain(j.output),
            }
            for j in self.queue
        ]
        return {
            "jobs": jobs,
            "issued": self.issued,
            "stale_dropped_total": self.stale_dropped_total,
        }

    def in_flight(self, run: Stepped) -> InFlightState:
        """This pipeline as a part of the run's state ``run``
        (:class:`~hf_algos.trainers.lifecycle.run_state.RunState`), restored at its step
        (the policy version after the load)."""
        return InFlightState(self, run)

    def load_state_dict(self, state: dict[str, Any], version: int) -> None:
        """Restore :meth:`state_dict` for a trainer (and rollout) at policy ``version``;
        calls in flight before are forgotten (their groups are gone or reloaded)."""
        self.queue = deque(
            GenerationJob(
                j["index"],
                from_plain(j["prompts"]),
                output=None if j["output"] is None else from_plain(j["output"]),
            )
            for j in state["jobs"]
        )
        self.issued = int(state["issued"])
        self.stale_dropped_total = int(state["stale_dropped_total"])
        self.rollout_version = version
        self._push = None


class Stepped(Protocol):
    """What has a step: the run's state (its last step, the trainer's policy version)."""

    step: int


class InFlightState:
    """An :class:`AsyncRollout`'s generations in flight as a part of the run's state:
    :meth:`AsyncRollout.state_dict`, restored at the trainer's step when loaded."""

    def __init__(self, pipeline: AsyncRollout, run: Stepped) -> None:
        self.pipeline, self.run = pipeline, run

    def state_dict(self) -> dict[str, Any]:
        """What is in flight (:meth:`AsyncRollout.state_dict`)."""
        return self.pipeline.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore it for a trainer (and rollout) at the run's step, the policy version."""
        self.pipeline.load_state_dict(state, self.run.step)
