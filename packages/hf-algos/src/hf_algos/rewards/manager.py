"""The rule-based reward manager: decode responses, score them by data_source in parallel."""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

import cloudpickle
import numpy as np
import torch

from hf_algos.config.reward import RewardSection
from hf_algos.data.collate import COLUMNS
from hf_algos.data.loader import CollatingDataset, first_row
from hf_algos.rewards.circuit import RewardSetupError, TimeoutCircuit, judge_probes, probe_answer
from hf_algos.rewards.outcome import ScoringOutcome
from hf_algos.rewards.pool import RewardError, ScoringPool, gather_outcomes
from hf_algos.rewards.registry import (
    SCORING_FUNCTIONS,
    RewardEntry,
    ScoreFn,
    resolve_scoring_function,
    scoring_call_of,
)
from hf_algos.rewards.scoring_worker import ScoringTask
from hf_algos.rewards.signature import ScoringSignatureError
from hf_algos.rewards.token_scores import place_on_last_token, response_mask_of
from hf_algos.rewards.user_file import FileScoringFunction
from hf_algos.rewards.weighted import AnyScoringCall, WeightedRewardFunctions, calls_per_sample
from hf_controller import ConfigurationError
from hf_protocol import DataProto, fields

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

_Call = tuple[RewardEntry, AnyScoringCall, bytes]
"""A data_source's function (or weighted list), how it is called, and its pickled call."""

_CHUNKS_PER_WORKER = 4
"""Chunks each scoring process gets per batch: few round trips, yet work still spreads
over the processes when samples take unequal time."""


class RewardManager:
    """Scores a rollout batch with rule-based functions chosen by each row's ``data_source``.

    The batch needs ``responses`` and ``response_mask`` (``(B, R)``) and the non-tensors
    ``data_source`` and ``reward_model`` (``{"ground_truth": ...}``; ``extra_info`` is
    optional); ``default_function`` (``reward.function_path``) scores the data_sources that
    have no function registered by the user (see
    :func:`~hf_algos.rewards.registry.resolve_scoring_function`); it may be a
    :class:`~hf_algos.rewards.weighted.WeightedRewardFunctions` (TRL's ``reward_funcs`` with
    ``reward_weights``), whose functions' unweighted scores also appear as extras under their
    names (``reward/<name>/mean``). Only response tokens under
    the mask are decoded. Functions are called by
    keyword with the fields they name (see :mod:`hf_algos.rewards.signature`) in a pool of
    worker processes with a per-sample timeout; a function that raises or runs out of time
    gives that sample 0, is logged with the sample's text and data_source, and is counted.
    The result is a new DataProto to ``union`` into the batch:

    * ``token_level_scores`` ``(B, R)`` float32: the score on the last response token;
    * non-tensor ``reward_extra_info``: per sample ``{"score", "status", "error", **extras}``;
    * ``meta_info["metrics"]``: ``reward/errors`` (samples that failed, timeouts included),
      ``reward/timeouts``, ``reward/score/mean`` and ``reward/<extra>/mean``;
    * ``meta_info["reward_errors"]``: one dict per failed sample (index, data_source,
      status, error, response, ground_truth).

    It raises :class:`RewardError` (never scores 0) when a function cannot be loaded or
    called with the batch's fields, when a scoring process dies (naming its exit cause), and
    when more than ``max_error_fraction`` of the batch failed.

    Call :meth:`close` (or use it as a context manager) to stop the worker processes; a
    manager dropped or left open at exit is closed by a finalizer.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        config: RewardSection | None = None,
        registry: Mapping[str, ScoreFn] | None = None,
        default_function: RewardEntry | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config or RewardSection()
        self.registry = SCORING_FUNCTIONS if registry is None else registry
        self.default_function = default_function
        # The pool lives in a holder the finalizer can reach without keeping ``self`` alive.
        self._pools: list[ScoringPool] = []
        self._pool_lock = threading.RLock()  # _run holds it around _pool()
        self._dispatcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward")
        self._calls: dict[int, _Call] = {}
        self._finalizer = weakref.finalize(self, _close_pools, self._pools, self._dispatcher)

    @classmethod
    def from_config(
        cls,
        config: RewardSection,
        tokenizer: PreTrainedTokenizerBase,
        check_on: CollatingDataset | None = None,
    ) -> RewardManager:
        """The manager of a run's ``reward`` section: rule-based scoring by ``data_source``,
        with the function of ``config.function_path`` (when set; several named: their
        weighted sum, see :mod:`hf_algos.rewards.weighted`) for the data_sources your code
        registered none for. With ``check_on``, its first row is scored now, so a function
        that cannot be loaded or called fails set-up."""
        default: RewardEntry | None = None
        if config.function_path is not None:
            # Loaded here, in the driver, so a missing file, an import error or a missing
            # name fails set-up within seconds (the scoring processes load it again by path).
            names = config.function_names
            if len(names) == 1 and config.function_weights is None:
                default = FileScoringFunction(config.function_path, names[0])
            else:  # TRL's reward_funcs + reward_weights: a weighted sum
                default = WeightedRewardFunctions.from_file(
                    config.function_path, names, config.function_weights
                )
            scoring_call_of(default)  # refuses a signature that names no field, now
        manager = cls(tokenizer, config, default_function=default)
        if check_on is not None and len(check_on) > 0:
            try:
                manager.check(first_row(check_on))
            except BaseException:
                manager.close()
                raise
        return manager

    # ------------------------------------------------------------------ public API

    def score(self, batch: DataProto) -> DataProto:
        """Score ``batch`` and wait for the result (see the class docstring)."""
        texts = self.decode_responses(batch)
        calls, samples = self._samples(batch, texts)
        outcomes = self._run(calls, samples)
        sources = [sample["data_source"] for sample in samples]
        truths = [sample["ground_truth"] for sample in samples]
        output = self._build_output(batch, outcomes, texts, sources, truths)
        self._check_error_fraction(output.meta_info[fields.REWARD_ERRORS], len(batch))
        return output

    def score_async(self, batch: DataProto) -> Future[DataProto]:
        """Start scoring ``batch`` in the background; the future gives :meth:`score`'s result.

        Batches submitted one after another are scored in order, one at a time.
        """
        return self._dispatcher.submit(self.score, batch)

    def check(self, rows: DataProto) -> None:
        """Score the first row of a data-loader batch with probe responses (no response
        yet: an empty one, and the row's ground truth written out) so a function that cannot
        work fails set-up, not the first step.

        ``rows`` needs ``data_source`` and ``reward_model``. A function that cannot be
        loaded or called, or that fails or times out on every probe, raises
        :class:`~hf_algos.rewards.circuit.RewardSetupError` (a user error, exit 2); one that
        fails on some probes is only logged (an empty response may fairly make a parser
        raise)."""
        self._finish_check(*self._check_sample(rows))

    def start(self) -> Future[None]:
        """Start the scoring processes now, in the background, instead of at the first score.

        Their start-up (a fresh Python that imports the scoring code: 3-5 s on 2 CPU cores)
        then runs while the caller loads data and starts its workers. Later calls queue
        behind it; the future raises if a process cannot start.
        """
        return self._dispatcher.submit(self._start_pool)

    def _start_pool(self) -> None:
        pool = self._pool()
        try:
            pool.start_processes()
        except BrokenProcessPool as error:
            causes = "; ".join(pool.dead_processes()) or "exit cause unknown"
            with self._pool_lock:
                if self._pools and self._pools[0] is pool:
                    self._pools.pop().close(kill=True)
            raise RewardError(f"a scoring process could not start: {causes}") from error

    def _pool(self) -> ScoringPool:
        """The scoring pool, created (its processes not yet started) if there is none or
        the last one broke (every worker died while idle)."""
        with self._pool_lock:
            if self._pools and self._pools[0].broken:
                self._pools.pop().close(kill=True)
            if not self._pools:
                self._pools.append(
                    ScoringPool(
                        self.config.process_start_method,
                        self.config.num_workers,
                        self.config.max_memory_mb,
                    )
                )
            return self._pools[0]

    def check_async(self, rows: DataProto) -> Future[None]:
        """:meth:`check`, with the scoring process's start-up and the call in the background.

        The function of the row's data_source is resolved, inspected and pickled now, so one
        that cannot be found, or names no field, raises here; the future raises what
        :meth:`check` would raise in the scoring process (e.g. a function that cannot be
        loaded there). A trainer starts its worker groups meanwhile (the scoring process's
        imports took 4-5 s of a 23 s GRPO start-up on 2 CPU cores).
        """
        return self._dispatcher.submit(self._finish_check, *self._check_sample(rows))

    def _check_sample(self, rows: DataProto) -> tuple[dict[str, _Call], list[dict[str, Any]]]:
        """The scoring call and the probe samples of ``rows``' first row: an empty response,
        and its ground truth written out (:func:`~hf_algos.rewards.circuit.probe_answer`)."""
        first = rows[:1]
        assert isinstance(first, DataProto)  # a slice is a batch
        calls, samples = self._samples(first, [""])
        answered = self._samples(first, [probe_answer(samples[0])])[1]
        return calls, samples + answered

    def _samples(
        self, batch: DataProto, texts: list[str]
    ) -> tuple[dict[str, _Call], list[dict[str, Any]]]:
        """The scoring call of each data_source in ``batch`` and one sample per row with the
        fields the calls read (see :mod:`hf_algos.rewards.signature`); raises
        :class:`RewardError` naming the row when a call needs a field the row lacks."""
        size = len(batch)
        column = batch.non_tensor_batch.get
        sources = ["" if s is None else str(s) for s in _column(batch, fields.DATA_SOURCE)]
        calls = {source: self._scoring_call(source) for source in dict.fromkeys(sources)}
        truths = [_ground_truth(row) for row in _column(batch, fields.REWARD_MODEL)]
        extras = list(column(fields.EXTRA_INFO, [None] * size))
        columns = list(column(COLUMNS, [{}] * size))
        prompts = (
            self._prompts(batch)
            if any(c.needs("prompt") for _, c, _ in calls.values())
            else [None] * size
        )
        raw_prompts = list(column(fields.RAW_PROMPT, [None] * size))
        samples = []
        for i, (text, source, prompt) in enumerate(zip(texts, sources, prompts, strict=True)):
            call = calls[source][1]
            chat = isinstance(prompt, list) or isinstance(raw_prompts[i], list)
            sample = {"solution": text, "ground_truth": truths[i], "data_source": source}
            sample.update(extra_info=extras[i], prompt=prompt, columns=columns[i] or {})
            # TRL gives a chat prompt's completion as one assistant message
            sample["completion"] = [{"role": "assistant", "content": text}] if chat else text
            _check_fields(call, sample, i)
            samples.append(sample)
        return calls, samples

    def _finish_check(self, calls: dict[str, _Call], samples: list[dict[str, Any]]) -> None:
        try:
            outcomes = self._run(calls, samples)
        except RewardSetupError:
            raise
        except RewardError as error:  # cannot be loaded or called, or killed its process
            raise RewardSetupError(f"reward set-up check: {error}") from error
        judge_probes(calls[samples[0]["data_source"]][1].name, samples, outcomes)

    def decode_responses(self, batch: DataProto) -> list[str]:
        """The text of each row's response tokens (those where ``response_mask`` is 1)."""
        responses = _tensor(batch, fields.RESPONSES)
        mask = response_mask_of(batch)
        # One conversion to lists, then plain Python: indexing each row's tensor cost more
        # than the decoding itself at 128 short rows per step.
        token_lists = [
            [token for token, keep in zip(row, keeps, strict=True) if keep]
            for row, keeps in zip(responses.tolist(), mask.bool().tolist(), strict=True)
        ]
        return list(
            self.tokenizer.batch_decode(
                token_lists, skip_special_tokens=self.config.skip_special_tokens
            )
        )

    def close(self) -> None:
        """Stop the scoring processes (and the helper processes they needed) and the
        background thread."""
        self._finalizer()

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _scoring_call(self, data_source: str) -> _Call:
        """The function of ``data_source``, how it is called, and its pickled form (by value
        for a script's or notebook's function, as Ray sends them)."""
        fn = resolve_scoring_function(data_source, self.registry, self.default_function)
        cached = self._calls.get(id(fn))
        if cached is not None and cached[0] is fn:
            return cached
        try:
            call = scoring_call_of(fn)
        except ScoringSignatureError as error:
            raise ScoringSignatureError(f"data_source {data_source!r}: {error}") from error
        try:
            blob = cloudpickle.dumps(call)
        except Exception as error:
            raise TypeError(
                f"the scoring function for data_source {data_source!r} ({call.name}) cannot "
                f"be pickled into a worker process ({type(error).__name__}: {error}); it must "
                f"not hold locks, open files or other unpicklable state"
            ) from error
        self._calls[id(fn)] = (fn, call, blob)
        return fn, call, blob

    def _prompts(self, batch: DataProto) -> list[Any]:
        if fields.RAW_PROMPT in batch.non_tensor_batch:
            return list(batch.non_tensor_batch[fields.RAW_PROMPT])
        if batch.batch is None or fields.PROMPTS not in batch.batch:
            return [None] * len(batch)
        prompts = batch.batch[fields.PROMPTS]
        mask = batch.batch.get(fields.ATTENTION_MASK)
        keep = mask[:, : prompts.shape[1]] if mask is not None else torch.ones_like(prompts)
        tokens = [row[m.bool()].tolist() for row, m in zip(prompts, keep, strict=True)]
        return list(self.tokenizer.batch_decode(tokens, skip_special_tokens=True))

    def _tasks(
        self, calls: Mapping[str, _Call], samples: list[dict]
    ) -> list[tuple[list[int], ScoringTask]]:
        """Samples grouped by data_source, in chunks (about four per worker): a round trip
        to a worker costs more than a cheap rule-based score (128 samples, 1 worker: 9.0 ->
        3.4 ms), one chunk when there is one worker. Each sample keeps its own alarm inside
        the worker."""
        workers = self.config.num_workers
        # One process has nothing to spread work over: one chunk, one round trip.
        chunks = 1 if workers == 1 else workers * _CHUNKS_PER_WORKER
        size = max(1, math.ceil(len(samples) / chunks))
        by_source: dict[str, list[int]] = {}
        for index, sample in enumerate(samples):
            by_source.setdefault(sample["data_source"], []).append(index)
        tasks = []
        for source, indices in by_source.items():
            blob = calls[source][2]
            for start in range(0, len(indices), size):
                chunk = indices[start : start + size]
                task = ScoringTask(
                    function=blob,
                    samples=[samples[i] for i in chunk],
                    timeout_s=self.config.timeout_s,
                    cpu_limit_per_sample_s=self.config.cpu_limit_per_sample_s,
                    max_consecutive_timeouts=self.config.max_consecutive_timeouts,
                )
                tasks.append((chunk, task))
        return tasks

    def _run(self, calls: Mapping[str, _Call], samples: list[dict]) -> list[ScoringOutcome]:
        tasks = self._tasks(calls, samples)
        outcomes: list[ScoringOutcome] = [ScoringOutcome() for _ in samples]
        with self._pool_lock:
            pool = self._pool()
            deadline = self._deadline(calls, len(samples), len(tasks))  # start-up included
            futures = {
                pool.submit(task, self._task_timeout(calls, task)): (chunk, task)
                for chunk, task in tasks
            }
            circuit = self._circuit(calls, samples, outcomes)
            try:
                stuck = gather_outcomes(pool, futures, deadline, outcomes, circuit)
            except BaseException:
                # A worker died (or the caller was interrupted): replace the pool.
                self._pools.pop().close(kill=True)
                raise
            if stuck:
                # The pool did not end a stuck task: replace it so the next batch is not held.
                self._pools.pop().close(kill=True)
        self._raise_on_fatal(calls, samples, outcomes)
        return outcomes

    def _circuit(
        self, calls: Mapping[str, _Call], samples: list[dict], outcomes: list[ScoringOutcome]
    ) -> Callable[[list[int]], None]:
        """What :func:`gather_outcomes` calls with each finished chunk: a
        :class:`TimeoutCircuit` that stops the batch when a function keeps timing out."""
        config = self.config
        circuit = TimeoutCircuit(config.max_consecutive_timeouts, config.timeout_s, len(samples))

        def record(chunk: list[int]) -> None:
            source = samples[chunk[0]]["data_source"]
            circuit.record(calls[source][1].name, source, [outcomes[i] for i in chunk])

        return record

    def _task_timeout(self, calls: Mapping[str, _Call], task: ScoringTask) -> float:
        """Seconds ``task`` may run before its process is killed and replaced: each of its
        calls' ``timeout_s``, plus the grace."""
        call = calls[task.samples[0]["data_source"]][1]
        budget = self.config.timeout_s * len(task.samples) * calls_per_sample(call)
        return budget + self.config.hard_timeout_grace_s

    def _deadline(self, calls: Mapping[str, _Call], samples: int, tasks: int) -> float:
        """When a batch still not scored means a stuck pool: every round of samples over the
        workers, and a grace for each round of tasks and for the processes' start-up."""
        workers = self.config.num_workers
        per_sample = max((calls_per_sample(c) for _, c, _ in calls.values()), default=1)
        rounds = math.ceil(samples / workers) * per_sample
        grace = self.config.hard_timeout_grace_s * (math.ceil(tasks / workers) + 1)
        return _now() + self.config.timeout_s * rounds + grace

    def _raise_on_fatal(
        self,
        calls: Mapping[str, _Call],
        samples: list[dict],
        outcomes: list[ScoringOutcome],
    ) -> None:
        for sample, outcome in zip(samples, outcomes, strict=True):
            if outcome.status == "fatal":
                source = sample["data_source"]
                raise RewardError(
                    f"the scoring function for data_source {source!r} "
                    f"({calls[source][1].name}) {outcome.error}. It must be importable in a "
                    f"fresh process (define it at module level of an importable module, or in "
                    f"your script) and accept the fields it names"
                )

    def _check_error_fraction(self, reports: list[dict[str, Any]], size: int) -> None:
        limit = self.config.max_error_fraction
        if size == 0 or len(reports) / size <= limit:
            return
        shown = "\n".join(
            f"  sample {r['index']} (data_source {r['data_source']!r}, {r['status']}): "
            f"{r['error'].splitlines()[-1] if r['error'] else ''} | response {r['response'][:80]!r}"
            for r in reports[: self.config.max_logged_errors]
        )
        raise RewardError(
            f"{len(reports)} of {size} samples failed to score ({len(reports) / size:.0%}, over "
            f"reward.max_error_fraction={limit:g}); the first failures:\n{shown}\nFix the "
            f"scoring function, or raise reward.max_error_fraction (1.0 never stops)"
        )

    def _build_output(
        self,
        batch: DataProto,
        outcomes: list[ScoringOutcome],
        texts: list[str],
        sources: list[str],
        truths: list[Any],
    ) -> DataProto:
        scores = torch.tensor([o.score for o in outcomes], dtype=torch.float32)
        token_level_scores = place_on_last_token(scores, response_mask_of(batch))
        failures = [i for i, o in enumerate(outcomes) if o.status != "ok"]
        reports = [
            {
                "index": i,
                "data_source": sources[i],
                "status": outcomes[i].status,
                "error": outcomes[i].error,
                "response": texts[i][:500],
                "ground_truth": truths[i],
            }
            for i in failures
        ]
        self._log_failures(reports)
        metrics: dict[str, float] = {
            "reward/errors": float(len(failures)),
            "reward/timeouts": float(sum(o.status == "timeout" for o in outcomes)),
            "reward/score/mean": float(scores.mean()) if len(scores) else 0.0,
        }
        for name in sorted({k for o in outcomes for k in o.extras}):
            values = [o.extras[name] for o in outcomes if name in o.extras]
            metrics[f"reward/{name}/mean"] = float(np.mean(values))
        extra_info = [
            {"score": o.score, "status": o.status, "error": o.error, **o.extras} for o in outcomes
        ]
        return DataProto.from_dict(
            tensors={fields.TOKEN_LEVEL_SCORES: token_level_scores},
            non_tensors={fields.REWARD_EXTRA_INFO: extra_info},
            meta_info={fields.METRICS: metrics, fields.REWARD_ERRORS: reports},
        )

    def _log_failures(self, reports: list[dict[str, Any]]) -> None:
        shown = reports[: self.config.max_logged_errors]
        for report in shown:
            logger.warning(
                "reward: sample %d (data_source %r) scored 0 after %s: %s\nresponse: %r\n"
                "ground truth: %r",
                report["index"],
                report["data_source"],
                report["status"],
                report["error"],
                report["response"][:300],
                report["ground_truth"],
            )
        if len(reports) > len(shown):
            logger.warning(
                "reward: %d more failed samples in this batch", len(reports) - len(shown)
            )


def _close_pools(pools: list[ScoringPool], dispatcher: ThreadPoolExecutor) -> None:
    """The finalizer of a :class:`RewardManager` (also run at interpreter exit)."""
    dispatcher.shutdown(wait=True)
    while pools:
        pools.pop().close(kill=True)


def _now() -> float:
    return time.monotonic()


def _tensor(batch: DataProto, key: str) -> torch.Tensor:
    if batch.batch is None or key not in batch.batch:
        raise KeyError(f"the batch has no {key!r} tensor; score a rollout output batch")
    return batch.batch[key]


def _column(batch: DataProto, key: str) -> np.ndarray:
    if key not in batch.non_tensor_batch:
        raise KeyError(
            f"the batch has no non-tensor {key!r}; the data loader's columns (data_source, "
            f"reward_model) must travel with the rollout (have {sorted(batch.non_tensor_batch)})"
        )
    return batch.non_tensor_batch[key]


def _ground_truth(reward_model: Any) -> Any:
    """The row's ``reward_model.ground_truth``, ``None`` where it has none."""
    if isinstance(reward_model, Mapping):
        return reward_model.get("ground_truth")
    return None


def _check_fields(call: AnyScoringCall, sample: Mapping[str, Any], index: int) -> None:
    """Raise naming row ``index`` when ``call`` reads a field or column it lacks (never a
    silent ``None``): a data or config error (:class:`ConfigurationError`), not a score."""
    if call.needs("ground_truth") and sample["ground_truth"] is None:
        raise ConfigurationError(
            f"row {index} (data_source {sample['data_source']!r}) has no "
            f"reward_model.ground_truth, which {call.name} takes; give rows "
            "reward_model: {ground_truth: ...}, or a function without ground_truth"
        )
    missing = [name for name in call.columns if name not in sample["columns"]]
    if missing:
        raise ConfigurationError(
            f"{call.name} takes the dataset column(s) {missing}, which row {index} lacks "
            f"(its columns: {sorted(sample['columns'])}); add the column to the data, or "
            "give the parameter a default"
        )
