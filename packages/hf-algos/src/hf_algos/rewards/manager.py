"""The rule-based reward manager: decode responses, score them by data_source in parallel."""

from __future__ import annotations

import dataclasses
import logging
import math
import multiprocessing
import multiprocessing.pool
import pickle
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hf_algos.rewards.placement import place_on_last_token, response_mask_of
from hf_algos.rewards.registry import SCORING_FUNCTIONS, ScoreFn, get_scoring_function
from hf_algos.rewards.scoring_worker import ScoringOutcome, run_scoring_chunk
from hf_protocol import DataProto, fields

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

_CHUNKS_PER_WORKER = 4
"""Chunks each scoring process gets per batch: few round trips, yet work still spreads
over the processes when samples take unequal time."""


@dataclass
class RewardManagerConfig:
    """How :class:`RewardManager` runs scoring functions."""

    num_workers: int = 2
    """Scoring processes. Scoring never runs in the driver process, so a hang can be cut."""
    timeout_s: float = 10.0
    """Seconds one sample may take; past it the sample scores 0 and is reported."""
    hard_timeout_grace_s: float = 60.0
    """Extra seconds per batch (process start-up included) before a pool whose worker ignores
    the alarm, or died, is replaced; its unfinished samples score 0 and are reported."""
    start_method: str | None = None
    """multiprocessing start method; ``None`` picks ``forkserver`` where available (workers
    fork from a clean server that has imported the scoring code once, so a replaced worker
    starts fast and no Ray/torch threads are forked), else ``spawn``."""
    skip_special_tokens: bool = True
    """Drop special tokens (EOS, chat markers) from the decoded response text."""
    max_logged_errors: int = 5
    """Failures logged one by one per batch; the rest are counted in one line."""

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.timeout_s <= 0 or self.hard_timeout_grace_s < 0:
            raise ValueError(
                f"timeout_s must be > 0 and hard_timeout_grace_s >= 0, got {self.timeout_s} "
                f"and {self.hard_timeout_grace_s}"
            )
        if self.start_method is None:
            available = multiprocessing.get_all_start_methods()
            self.start_method = "forkserver" if "forkserver" in available else "spawn"
        if self.start_method not in multiprocessing.get_all_start_methods():
            raise ValueError(
                f"start_method {self.start_method!r} is not available here; choose from "
                f"{multiprocessing.get_all_start_methods()}"
            )


class RewardManager:
    """Scores a rollout batch with rule-based functions chosen by each row's ``data_source``.

    The batch needs ``responses`` and ``response_mask`` (``(B, R)``) and the non-tensors
    ``data_source`` and ``reward_model`` (``{"ground_truth": ...}``; ``extra_info`` is
    optional). Only response tokens under the mask are decoded. Each sample is scored in a
    pool of worker processes with a per-sample timeout; a function that raises or runs out
    of time gives that sample 0, is logged with the sample's text and data_source, and is
    counted. The result is a new DataProto to ``union`` into the batch:

    * ``token_level_scores`` ``(B, R)`` float32: the score on the last response token;
    * non-tensor ``reward_extra_info``: per sample ``{"score", "status", "error", **extras}``;
    * ``meta_info["metrics"]``: ``reward/errors`` (samples that failed, timeouts included),
      ``reward/timeouts``, ``reward/score/mean`` and ``reward/<extra>/mean``;
    * ``meta_info["reward_errors"]``: one dict per failed sample (index, data_source,
      status, error, response, ground_truth).

    Call :meth:`close` (or use it as a context manager) to stop the worker processes.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        config: RewardManagerConfig | None = None,
        registry: Mapping[str, ScoreFn] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config or RewardManagerConfig()
        self.registry = SCORING_FUNCTIONS if registry is None else registry
        self._pool: multiprocessing.pool.Pool | None = None
        self._pool_lock = threading.Lock()
        self._dispatcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward")
        self._checked_picklable: set[int] = set()

    # ------------------------------------------------------------------ public API

    def score(self, batch: DataProto) -> DataProto:
        """Score ``batch`` and wait for the result (see the class docstring)."""
        texts = self.decode_responses(batch)
        sources = [str(s) for s in _column(batch, fields.DATA_SOURCE)]
        truths = [
            _ground_truth(row, i) for i, row in enumerate(_column(batch, fields.REWARD_MODEL))
        ]
        extras = list(batch.non_tensor_batch.get(fields.EXTRA_INFO, [None] * len(batch)))
        fns = [self._scoring_function(source) for source in sources]
        outcomes = self._run(fns, texts, truths, extras)
        return self._build_output(batch, outcomes, texts, sources, truths)

    def score_async(self, batch: DataProto) -> Future[DataProto]:
        """Start scoring ``batch`` in the background; the future gives :meth:`score`'s result.

        Batches submitted one after another are scored in order, one at a time.
        """
        return self._dispatcher.submit(self.score, batch)

    def decode_responses(self, batch: DataProto) -> list[str]:
        """The text of each row's response tokens (those where ``response_mask`` is 1)."""
        responses = _tensor(batch, fields.RESPONSES)
        mask = response_mask_of(batch)
        token_lists = [row[m.bool()].tolist() for row, m in zip(responses, mask, strict=True)]
        return list(
            self.tokenizer.batch_decode(
                token_lists, skip_special_tokens=self.config.skip_special_tokens
            )
        )

    def close(self) -> None:
        """Stop the scoring processes and the background thread."""
        self._dispatcher.shutdown(wait=True)
        with self._pool_lock:
            if self._pool is not None:
                self._pool.terminate()
                self._pool.join()
                self._pool = None

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _scoring_function(self, data_source: str) -> ScoreFn:
        fn = get_scoring_function(data_source, self.registry)
        if id(fn) not in self._checked_picklable:
            try:
                pickle.dumps(fn)
            except Exception as error:
                raise TypeError(
                    f"the scoring function for data_source {data_source!r} ({fn!r}) cannot be "
                    f"pickled into a worker process ({error}); define it at module level"
                ) from error
            self._checked_picklable.add(id(fn))
        return fn

    def _run(
        self, fns: list[ScoreFn], texts: list[str], truths: list[Any], extras: list[Any]
    ) -> list[ScoringOutcome]:
        timeout = self.config.timeout_s
        with self._pool_lock:
            if self._pool is None:
                self._pool = _new_pool(self.config.start_method, self.config.num_workers)
            pool = self._pool
            jobs = [
                (fn, text, truth, extra, timeout)
                for fn, text, truth, extra in zip(fns, texts, truths, extras, strict=True)
            ]
            rounds = math.ceil(len(jobs) / self.config.num_workers)
            deadline = _now() + timeout * rounds + self.config.hard_timeout_grace_s
            # Samples travel in chunks (about four per worker), not one by one: a round trip
            # to a worker costs more than a cheap rule-based score (128 samples, 1 worker:
            # 9.0 -> 3.4 ms). Each sample keeps its own alarm inside the worker.
            size = max(1, len(jobs) // (self.config.num_workers * _CHUNKS_PER_WORKER))
            chunks = [jobs[i : i + size] for i in range(0, len(jobs), size)]
            handles = [pool.apply_async(run_scoring_chunk, (chunk,)) for chunk in chunks]
            outcomes = [
                outcome
                for handle, chunk in zip(handles, chunks, strict=True)
                for outcome in _collect(handle, len(chunk), deadline)
            ]
            if any(o.status == "timeout" and o.error.startswith("hard") for o in outcomes):
                # A worker is stuck (or gone): replace the pool so the next batch is not held.
                pool.terminate()
                pool.join()
                self._pool = None
        return outcomes

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


def _new_pool(start_method: str | None, num_workers: int) -> multiprocessing.pool.Pool:
    context = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        # Import the scoring code once in the server, not in every worker.
        context.set_forkserver_preload(["hf_algos.rewards.scoring_worker"])
    return context.Pool(num_workers)


def _now() -> float:
    return time.monotonic()


def _collect(
    handle: multiprocessing.pool.AsyncResult[list[ScoringOutcome]], size: int, deadline: float
) -> list[ScoringOutcome]:
    """The outcomes of a chunk of ``size`` samples, or ``size`` failures past ``deadline``."""
    try:
        return handle.get(timeout=max(0.0, deadline - _now()))
    except multiprocessing.TimeoutError:
        failed = ScoringOutcome(
            status="timeout",
            error="hard deadline passed: the worker ignored the alarm, hung in C code or died",
        )
    except Exception as error:  # raised while returning the result (e.g. unpicklable extras)
        failed = ScoringOutcome(status="error", error=f"{type(error).__name__}: {error}")
    return [dataclasses.replace(failed) for _ in range(size)]


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


def _ground_truth(reward_model: Any, index: int) -> Any:
    if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
        raise KeyError(
            f"row {index}: reward_model is {reward_model!r:.80}; it must be a dict with a "
            f"'ground_truth' entry"
        )
    return reward_model["ground_truth"]
