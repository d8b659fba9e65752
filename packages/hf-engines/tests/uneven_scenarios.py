"""Uneven batches on N gloo ranks, run by test_uneven_batches.py (``launch_ranks``).

Usage: ``python uneven_scenarios.py {fsdp,megatron,pairs} MODEL_DIR OUT_DIR [MICRO,...]``. For
every loss aggregation mode and micro-batch setting (default: all of :data:`MICRO_BATCHES`),
a fresh engine takes one update call of :func:`run_update` on the same 7-row batch (global
mini-batches of rows 0-2, 3-4, 5-6; each rank holds its balanced slice as the driver's
dispatch sends it: on 2 ranks rows 0-3 and 4-6, so one mini-batch is split between the
ranks and the others leave a rank with a filler). Rank 0 writes ``OUT_DIR/rank0.pt``: per
case the step losses, grad norms and the updated weights. ``pairs``: FSDP on 10 rows held as
5 pairs (``row_group_size=2``, mini-batches of 3 + 2 pairs), with a loss that refuses a
micro-batch that is not whole pairs; on 3 ranks the dispatch's 4/3/3 rows split a pair, so
the ranks regroup to 4/4/2.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hf_engines import EngineConfig, config_from_dict
from hf_engines.engine import LossOutput, ModelOutputs
from hf_engines.testing import make_toy_batch, mini_batch_total
from hf_engines.workers.updates import UpdateConfig, run_update
from hf_protocol import DataProto, fields

ROWS = 7
MINI_BATCH = 3  # 7 rows -> global mini-batches of 3, 2 and 2 rows
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
MICRO_BATCHES: dict[str, dict[str, Any]] = {
    "rows1": {"micro_batch_size": 1},
    "rows2": {"micro_batch_size": 2},
    "rows7": {"micro_batch_size": 7},  # each rank's part of a mini-batch in one piece
    "tokens12": {"micro_batch_size": None, "max_tokens": 12},
}


def toy_agg_loss(outputs: ModelOutputs, micro_batch: DataProto, *, mode: str) -> LossOutput:
    """Negative log-likelihood aggregated as ``mode``, returned as the micro-batch's share."""
    log_probs = outputs["log_probs"]
    assert micro_batch.batch is not None
    mask = micro_batch.batch[fields.RESPONSE_MASK].to(log_probs.device, log_probs.dtype)
    token_sums = -(log_probs * mask).sum(-1)
    has_tokens = (mask.sum(-1) > 0).to(log_probs.dtype)
    if mode == "token-mean":
        loss = token_sums.sum() / mini_batch_total(micro_batch, "tokens", mask.sum())
    else:
        divisor = mask.sum(-1).clamp(min=1.0) if mode == "seq-mean-token-mean" else mask.shape[1]
        per_sequence = token_sums / divisor * has_tokens
        loss = per_sequence.sum() / mini_batch_total(micro_batch, "sequences", has_tokens.sum())
    return loss, {"agg": float(loss.detach())}


def pair_loss(outputs: ModelOutputs, micro_batch: DataProto, *, mode: str) -> LossOutput:
    """:func:`toy_agg_loss` on a micro-batch of whole pairs (rows ``2k``, ``2k + 1``)."""
    assert len(micro_batch) % 2 == 0, f"a micro-batch of {len(micro_batch)} rows splits a pair"
    return toy_agg_loss(outputs, micro_batch, mode=mode)


def _engine(backend: str, model_dir: str, micro_batch: dict[str, Any]) -> Any:
    config = config_from_dict(
        EngineConfig,
        {
            "backend": backend,
            "model": {"path": model_dir},
            "optim": {"lr": 1e-4},
            "micro_batch": micro_batch,
        },
    )
    if backend == "megatron":
        from hf_engines.megatron import MegatronEngine

        return MegatronEngine(config)
    from hf_engines.fsdp import FSDPEngine

    return FSDPEngine(config)


def run_case(backend: str, model_dir: str, mode: str, micro: str) -> dict[str, Any]:
    """One update call on this rank's slice; losses, grad norms and weights after it."""
    pairs = backend == "pairs"
    engine = _engine("fsdp" if pairs else backend, model_dir, MICRO_BATCHES[micro])
    batch = make_toy_batch(10 if pairs else ROWS, seed=11)
    shard = batch.chunk(dist.get_world_size())[dist.get_rank()]
    config = UpdateConfig(
        engine=engine.config,
        ppo_mini_batch_size=6 if pairs else MINI_BATCH,
        row_group_size=2 if pairs else 1,
    )
    loss_fn = functools.partial(pair_loss if pairs else toy_agg_loss, mode=mode)
    metrics = run_update(engine, shard, config, loss_fn, "actor")
    params = {name: tensor.detach().clone() for name, tensor in engine.iter_full_params()}
    return {
        "loss": metrics["actor/loss"],
        "grad_norm": metrics["actor/grad_norm"],
        "params": params,
    }


def main() -> None:
    """Run every (mode, micro-batch) case on this rank; rank 0 saves the results."""
    backend, model_dir, out_dir = sys.argv[1:4]
    micros = sys.argv[4].split(",") if len(sys.argv) > 4 else list(MICRO_BATCHES)
    modes = MODES[:1] if backend == "pairs" else MODES
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    results = {
        (mode, micro): run_case(backend, model_dir, mode, micro)
        for mode in modes
        for micro in micros
    }
    if dist.get_rank() == 0:
        torch.save(results, Path(out_dir) / "rank0.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
