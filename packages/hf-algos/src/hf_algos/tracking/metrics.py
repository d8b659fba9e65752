"""Training metrics computed from a batch, with verl's names, as pure functions.

Every function reads tensors of a :class:`hf_protocol.DataProto` (the batch fields of
``docs/architecture.md``) and returns ``{name: float}``. They are cheap (a few reductions
over ``(B, R)`` tensors) so a trainer can call them every step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from hf_protocol import DataProto, fields


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    """``{prefix}/mean``, ``/max``, ``/min`` of a 1-D tensor (zeros when empty)."""
    if values.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    values = values.float()
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def prompt_and_response_lengths(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens per prompt and per response, each ``(B,)`` float.

    Reads ``prompts`` (for the prompt width P), ``attention_mask`` ``(B, P + R)`` and
    ``response_mask`` ``(B, R)``.
    """
    tensors = batch.batch
    assert tensors is not None, "the batch holds no tensors"
    prompt_width = tensors[fields.PROMPTS].shape[-1]
    prompt_length = tensors[fields.ATTENTION_MASK][:, :prompt_width].sum(-1).float()
    response_length = tensors[fields.RESPONSE_MASK].sum(-1).float()
    return prompt_length, response_length


def compute_data_metrics(
    batch: DataProto, max_response_length: int | None = None, max_prompt_length: int | None = None
) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of a step's batch.

    Names: ``critic/score/{mean,max,min}`` (sequence sum of ``token_level_scores``),
    ``critic/rewards/...`` (of ``token_level_rewards``), ``critic/advantages/...`` and
    ``critic/returns/...`` (over valid response tokens), ``critic/values/...`` and
    ``critic/vf_explained_var`` (when ``values`` is present), ``response_length/...``,
    ``prompt_length/...`` and their ``clip_ratio`` (share at the maximum length, when given).
    Missing fields are skipped.
    """
    tensors = batch.batch
    if tensors is None:
        return {}
    mask = tensors[fields.RESPONSE_MASK].bool()
    keys = set(tensors.keys())  # TensorDict has no `in`; its keys view does
    metrics: dict[str, float] = {}
    if fields.TOKEN_LEVEL_SCORES in keys:
        metrics.update(_stats("critic/score", tensors[fields.TOKEN_LEVEL_SCORES].sum(-1)))
    if fields.TOKEN_LEVEL_REWARDS in keys:
        metrics.update(_stats("critic/rewards", tensors[fields.TOKEN_LEVEL_REWARDS].sum(-1)))
    for key, name in ((fields.ADVANTAGES, "advantages"), (fields.RETURNS, "returns")):
        if key in keys:
            metrics.update(_stats(f"critic/{name}", tensors[key][mask]))
    if fields.VALUES in keys:
        values = tensors[fields.VALUES][mask]
        metrics.update(_stats("critic/values", values))
        if fields.RETURNS in keys:
            returns = tensors[fields.RETURNS][mask].float()
            residual_var = torch.var(returns - values.float(), unbiased=False)
            return_var = torch.var(returns, unbiased=False)
            metrics["critic/vf_explained_var"] = float(1.0 - residual_var / (return_var + 1e-5))
    prompt_length, response_length = prompt_and_response_lengths(batch)
    metrics.update(_stats("response_length", response_length))
    metrics.update(_stats("prompt_length", prompt_length))
    if max_response_length:
        clipped = (response_length >= max_response_length).float().mean()
        metrics["response_length/clip_ratio"] = float(clipped)
    if max_prompt_length:
        metrics["prompt_length/clip_ratio"] = float(
            (prompt_length >= max_prompt_length).float().mean()
        )
    return metrics


def compute_timing_metrics(batch: DataProto, timing: Mapping[str, float]) -> dict[str, float]:
    """:func:`timing_metrics`, and ``timing_per_token_ms/<stage>``.

    Per-token time divides by the tokens the stage processed: response tokens for ``gen``,
    prompt + response tokens for the others.
    """
    prompt_length, response_length = prompt_and_response_lengths(batch)
    response_tokens = float(response_length.sum())
    all_tokens = response_tokens + float(prompt_length.sum())
    metrics = timing_metrics(timing)
    for name, value in timing.items():
        tokens = response_tokens if name == "gen" else all_tokens
        if tokens > 0 and name != "step" and f"timing_s/{name}" in metrics:
            metrics[f"timing_per_token_ms/{name}"] = 1000.0 * float(value) / tokens
    return metrics


def compute_throughput_metrics(
    batch: DataProto, step_seconds: float, n_workers: int
) -> dict[str, float]:
    """``perf/total_num_tokens``, ``perf/time_per_step`` and ``perf/throughput``.

    Throughput is tokens (prompt + response, unpadded) per second per worker.
    """
    tensors = batch.batch
    assert tensors is not None, "the batch holds no tensors"
    total_tokens = float(tensors[fields.ATTENTION_MASK].sum())
    throughput = total_tokens / max(step_seconds, 1e-9) / max(n_workers, 1)
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": float(step_seconds),
        "perf/throughput": throughput,
    }


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Means of metric lists (workers return one value per mini-batch); scalars pass through."""
    reduced: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().float().cpu().numpy()
        if isinstance(value, Sequence | np.ndarray) and not isinstance(value, str):
            array = np.asarray(value, dtype=np.float64)
            if array.size:
                reduced[name] = float(array.mean())
        else:
            reduced[name] = float(value)
    return reduced


def merge_worker_metrics(outputs: Sequence[DataProto | Mapping[str, Any]]) -> dict[str, float]:
    """Collect ``meta_info["metrics"]`` of worker outputs (or plain dicts) and average lists."""
    merged: dict[str, list[float]] = {}
    for output in outputs:
        metrics = (
            output.meta_info.get(fields.METRICS, {}) if isinstance(output, DataProto) else output
        )
        for name, value in metrics.items():
            values = value if isinstance(value, list | tuple) else [value]
            merged.setdefault(name, []).extend(float(v) for v in values)
    return reduce_metrics(merged)


MEMORY_PEAK = "memory_peak_gib/"
"""``timing`` key prefix: this process's peak CUDA memory allocated in a phase, GiB."""
MEMORY_DEVICE = "memory_device_gib/"
"""``timing`` key prefix: the device's used memory at a phase's end (all processes), GiB."""


@contextmanager
def timed(name: str, timing: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the ``with`` block, in seconds, to ``timing[name]``.

    In a process that uses CUDA (the local backend's worker runs in the driver), also
    record the block's memory: ``timing["memory_peak_gib/<name>"]``, the peak this process's
    torch allocated in it, and ``timing["memory_device_gib/<name>"]``, the device's used
    memory at its end, other processes (a vLLM engine) included. Phases must not nest: the
    peak counter is reset at each block's start.
    """
    track = torch.cuda.is_initialized()  # False where CUDA is absent
    if track:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        yield
    finally:
        timing[name] = timing.get(name, 0.0) + time.perf_counter() - start
        if track:
            peak = torch.cuda.max_memory_allocated() / 2**30
            timing[MEMORY_PEAK + name] = max(timing.get(MEMORY_PEAK + name, 0.0), peak)
            free, total = torch.cuda.mem_get_info()
            timing[MEMORY_DEVICE + name] = (total - free) / 2**30


def timing_metrics(timing: Mapping[str, float]) -> dict[str, float]:
    """``timing_s/<stage>`` for every timed stage; the memory entries of :func:`timed` as
    they are."""
    return {
        name if name.startswith((MEMORY_PEAK, MEMORY_DEVICE)) else f"timing_s/{name}": float(value)
        for name, value in timing.items()
    }


def compute_step_metrics(
    batch: DataProto,
    timing: Mapping[str, float],
    n_workers: int,
    max_response_length: int | None = None,
    max_prompt_length: int | None = None,
) -> dict[str, float]:
    """A generating step's data, timing and throughput metrics together
    (:func:`compute_data_metrics`, :func:`compute_timing_metrics`,
    :func:`compute_throughput_metrics`; ``timing["step"]`` is the step's wall time)."""
    metrics = compute_data_metrics(batch, max_response_length, max_prompt_length)
    metrics.update(compute_timing_metrics(batch, timing))
    metrics.update(compute_throughput_metrics(batch, timing["step"], n_workers))
    return metrics
