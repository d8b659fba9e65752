"""hf_algos' ppo_actor_loss through the engines' update loop on N gloo ranks; not collected.

Usage: ``python uneven_loss_scenarios.py MODEL_DIR OUT_DIR MICRO[,MICRO...]``. For every
loss aggregation mode and each named micro-batch setting, a fresh FSDP engine takes one
``run_update`` call on the same 7-row batch (global mini-batches of rows 0-3 and 4-6; each
rank holds its balanced slice, as the driver's dispatch sends it). Rank 0 writes
``OUT_DIR/rank0.pt``: per case the step losses, grad norms and the updated weights.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hf_algos.losses import ppo_actor_loss
from hf_engines import EngineConfig, FSDPEngine, config_from_dict
from hf_engines.testing import make_toy_batch
from hf_engines.workers.updates import UpdateConfig, run_update
from hf_protocol import DataProto, fields

ROWS = 7
MINI_BATCH = 4  # 7 rows -> global mini-batches of 4 and 3 rows
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
MICRO_BATCHES: dict[str, dict[str, Any]] = {
    "rows1": {"micro_batch_size": 1},
    "rows2": {"micro_batch_size": 2},
    "rows7": {"micro_batch_size": 7},
    "tokens12": {"micro_batch_size": None, "max_tokens": 12},
}


def _engine(model_dir: str, micro: str) -> FSDPEngine:
    config = config_from_dict(
        EngineConfig,
        {
            "model": {"path": model_dir},
            "optim": {"lr": 1e-4},
            "micro_batch": MICRO_BATCHES[micro],
        },
    )
    return FSDPEngine(config)


def ppo_batch(engine: FSDPEngine) -> DataProto:
    """7 rows with old log-probs (the engine's own, every rank scoring every row), a
    reference a little off them and advantages of both signs and several sizes."""
    batch = make_toy_batch(ROWS, seed=11)
    old, _ = engine.compute_log_prob(batch)
    mask = batch.batch[fields.RESPONSE_MASK].float()
    noise = torch.randn(old.shape, generator=torch.Generator().manual_seed(0))
    batch.batch[fields.OLD_LOG_PROBS] = old
    batch.batch[fields.REF_LOG_PROB] = old + 0.05 * noise
    batch.batch[fields.ADVANTAGES] = torch.linspace(-1.0, 1.5, ROWS).unsqueeze(-1) * mask
    return batch


def run_case(model_dir: str, mode: str, micro: str) -> dict[str, Any]:
    """One update call on this rank's slice; losses, grad norms and weights after it."""
    engine = _engine(model_dir, micro)
    batch = ppo_batch(engine)
    shard = batch.chunk(dist.get_world_size())[dist.get_rank()]
    config = UpdateConfig(engine=engine.config, ppo_mini_batch_size=MINI_BATCH)
    loss_fn = functools.partial(
        ppo_actor_loss, loss_agg_mode=mode, entropy_coeff=1e-2, use_kl_loss=True, kl_loss_coef=0.1
    )
    metrics = run_update(engine, shard, config, loss_fn, "actor")
    params = {name: tensor.detach().clone() for name, tensor in engine.iter_full_params()}
    return {
        "loss": metrics["actor/loss"],
        "grad_norm": metrics["actor/grad_norm"],
        "params": params,
    }


def main() -> None:
    """Run every (mode, micro-batch) case on this rank; rank 0 saves the results."""
    model_dir, out_dir, micros = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    results = {
        (mode, micro): run_case(model_dir, mode, micro) for mode in MODES for micro in micros
    }
    if dist.get_rank() == 0:
        torch.save(results, Path(out_dir) / "rank0.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
