"""Helpers for tests and examples: tiny local models, toy batches, multi-rank launches.

Nothing here touches a model hub: tiny models are built from a config with random weights
and saved to a local directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from hf_controller.worker import free_port as _rendezvous_port
from hf_engines.engine import LossOutput, ModelOutputs, mini_batch_total
from hf_engines.workers.distributed import init_distributed
from hf_protocol import DataProto, build_prompt_response_batch, fields
from hf_protocol.testing import save_tiny_model, tiny_decoder_config


def build_tiny_model(
    directory: str | os.PathLike[str], family: str = "llama", seed: int = 0
) -> Path:
    """Save a randomly initialised tiny ``family`` causal LM to ``directory``; return it.

    ``family`` is a key of :data:`hf_protocol.testing.TINY_DECODER_CONFIGS`. The same seed
    gives the same weights.
    """
    return save_tiny_model(directory, tiny_decoder_config(family), seed)


def make_toy_batch(
    batch_size: int,
    prompt_length: int = 6,
    response_length: int = 5,
    vocab_size: int = 128,
    seed: int = 0,
) -> DataProto:
    """A batch of the "count up" task: each response token is the previous token plus one.

    Prompts of random length are left-padded, responses of random length right-padded
    (pad id 0, never a real token). Fields: ``prompts``, ``responses``, ``response_mask``
    (``(B, R)``), ``input_ids``, ``attention_mask``, ``position_ids`` (``(B, P + R)``).
    """
    generator = torch.Generator().manual_seed(seed)
    prompt_ids: list[list[int]] = []
    response_ids: list[list[int]] = []
    for _ in range(batch_size):
        n_prompt = int(torch.randint(2, prompt_length + 1, (1,), generator=generator))
        n_response = int(torch.randint(1, response_length + 1, (1,), generator=generator))
        start = int(torch.randint(1, vocab_size, (1,), generator=generator))
        tokens = [(start + i - 1) % (vocab_size - 1) + 1 for i in range(n_prompt + n_response)]
        prompt_ids.append(tokens[:n_prompt])
        response_ids.append(tokens[n_prompt:])
    return build_prompt_response_batch(
        prompt_ids,
        response_ids,
        pad_id=0,
        prompt_width=prompt_length,
        response_width=response_length,
        meta_info={fields.TEMPERATURE: 1.0},
    )


def transformers_log_probs(
    model: torch.nn.Module, batch: DataProto
) -> tuple[torch.Tensor, torch.Tensor]:
    """Response log-probs and entropy ``(B, R)`` of ``batch`` under plain transformers, in
    this process: the reference an engine's ``compute_log_prob`` is checked against.

    Padding positions are not masked (multiply by ``response_mask``).
    """
    tensors = batch.batch
    if tensors is None:
        raise ValueError("transformers_log_probs needs a batch with tensors; this has none")
    responses = tensors[fields.RESPONSES]
    with torch.no_grad():
        logits = model(
            input_ids=tensors[fields.INPUT_IDS],
            attention_mask=tensors[fields.ATTENTION_MASK],
            position_ids=tensors[fields.POSITION_IDS],
        ).logits
    logits = logits[:, -responses.shape[1] - 1 : -1].float()
    log_softmax = torch.log_softmax(logits, dim=-1)
    log_probs = log_softmax.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_probs, entropy


def _response_mask(micro_batch: DataProto, device: torch.device) -> torch.Tensor:
    """The batch's ``response_mask`` as floats on ``device`` (where the model outputs are)."""
    if micro_batch.batch is None:
        raise ValueError("a toy loss needs a batch with tensors; this DataProto has none")
    return micro_batch.batch[fields.RESPONSE_MASK].float().to(device)


def toy_nll_loss(outputs: ModelOutputs, micro_batch: DataProto) -> LossOutput:
    """This micro-batch's share of the mini-batch's token-mean negative log-likelihood of
    the responses (metric ``nll``: its own token mean).

    The loss the engine and worker tests train with on :func:`make_toy_batch` batches.
    """
    mask = _response_mask(micro_batch, outputs["log_probs"].device)
    nll_sum = -(outputs["log_probs"] * mask).sum()
    loss = nll_sum / mini_batch_total(micro_batch, "tokens", mask.sum())
    return loss, {"nll": float(nll_sum.detach() / mask.sum().clamp(min=1.0))}


def toy_sum_nll_loss(outputs: ModelOutputs, micro_batch: DataProto) -> LossOutput:
    """The summed (not normalised) negative log-likelihood of the responses (metric
    ``nll``: its own token mean): gradients of calls over parts of a batch add up to the
    whole batch's, as a Tinker client's ``cross_entropy`` with per-token weights."""
    mask = _response_mask(micro_batch, outputs["log_probs"].device)
    nll_sum = -(outputs["log_probs"] * mask).sum()
    return nll_sum, {"nll": float(nll_sum.detach() / mask.sum().clamp(min=1.0))}


def toy_value_loss(outputs: ModelOutputs, micro_batch: DataProto) -> LossOutput:
    """This micro-batch's share of the token-mean squared error of the values against a
    target of 1 (metric ``vf_loss``: its own token mean)."""
    mask = _response_mask(micro_batch, outputs[fields.VALUES].device)
    error_sum = (((outputs[fields.VALUES] - 1.0) ** 2) * mask).sum()
    loss = error_sum / mini_batch_total(micro_batch, "tokens", mask.sum())
    return loss, {"vf_loss": float(error_sum.detach() / mask.sum().clamp(min=1.0))}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on, below the kernel's ephemeral range
    when it can be (``hf_controller.worker.free_port``, what a Ray worker group uses): a
    port from ``bind(0)`` can be taken by any outgoing connection on the machine (another
    job's, a Ray run's) before rank 0 listens on it."""
    return _rendezvous_port("127.0.0.1")


def join_launched_group(device: str = "cpu") -> None:
    """Start this rank's process group from the variables :func:`launch_ranks` sets, the
    way a worker does (:func:`~hf_engines.workers.distributed.init_distributed`, which
    also ends it at exit with
    :func:`~hf_engines.workers.distributed.shutdown_distributed`)."""
    env = os.environ
    init_distributed(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]), device)


def launch_ranks(
    script: str | os.PathLike[str],
    world_size: int,
    args: Sequence[str] = (),
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Run ``python script *args`` as ``world_size`` ranks of one gloo job; return outputs.

    Each rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT``, as a worker group provides. All ranks are killed
    when one fails or ``timeout`` seconds pass; the error names the rank and shows the end
    of its output.
    """
    port = str(free_port())
    logs = [Path(os.devnull)] * world_size
    procs: list[subprocess.Popen[bytes]] = []
    base_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    log_dir = Path(tempfile.mkdtemp(prefix="hf-engines-ranks-"))
    for rank in range(world_size):
        rank_env = {
            **base_env,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        log = log_dir / f"rank{rank}.log"
        logs[rank] = log
        with log.open("wb") as handle:
            command = [sys.executable, str(script), *args]
            procs.append(subprocess.Popen(command, env=rank_env, stdout=handle, stderr=handle))
    try:
        _wait_all(procs, logs, timeout)
        return [log.read_text(errors="replace") for log in logs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(log_dir, ignore_errors=True)


def _wait_all(procs: list[subprocess.Popen[bytes]], logs: list[Path], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(proc.poll() is None for proc in procs):
        failed = [r for r, proc in enumerate(procs) if proc.returncode not in (None, 0)]
        if failed or time.monotonic() > deadline:
            rank = failed[0] if failed else 0
            why = (
                f"exited with code {procs[rank].returncode}"
                if failed
                else f"timed out ({timeout}s)"
            )
            tail = logs[rank].read_text(errors="replace")[-4000:]
            raise RuntimeError(f"rank {rank} of {len(procs)} {why}; its output ends with:\n{tail}")
        time.sleep(0.1)
    for rank, proc in enumerate(procs):
        if proc.returncode != 0:
            tail = logs[rank].read_text(errors="replace")[-4000:]
            raise RuntimeError(
                f"rank {rank} of {len(procs)} exited with code {proc.returncode}; "
                f"its output ends with:\n{tail}"
            )
