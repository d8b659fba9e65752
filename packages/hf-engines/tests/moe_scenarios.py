"""Scenarios run as gloo ranks by test_moe.py (``launch_ranks``), not collected.

Usage: ``python moe_scenarios.py {fsdp,megatron} MODEL_DIR OUT_DIR``: the tiny Qwen3-MoE
model trained by FSDP (1 rank) or by Megatron with ``expert_model_parallel_size=2`` (2
ranks, so 2 data-parallel replicas too). Each rank writes ``OUT_DIR/rank<r>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hf_engines import EngineConfig, FSDPEngine, config_from_dict
from hf_engines.engine import TrainingEngine
from hf_engines.testing import make_toy_batch, toy_nll_loss
from hf_protocol import DataProto

STEPS = 2
ROWS = 5  # 3 / 2 rows over two replicas: uneven micro-batch counts need fillers


def shard(batch: DataProto) -> DataProto:
    """This rank's rows (every rank is its own data-parallel replica here)."""
    return batch.chunk(dist.get_world_size())[dist.get_rank()]


def make_engine(backend: str, model_dir: str) -> TrainingEngine:
    """An FSDP engine, or a Megatron one with two expert-parallel ranks."""
    settings: dict[str, Any] = {
        "backend": backend,
        "model": {"path": model_dir},
        # AdamW divides by sqrt(v) + eps: with eps 1e-8 a weight whose gradient is near 1e-8
        # moves by up to lr on gradient rounding alone (1e-5 apart after the two backends'
        # different summation orders); 1e-6 keeps the trained weights comparable at 1e-5.
        "optim": {"lr": 1e-2, "warmup_steps": 0, "eps": 1e-6},
        "micro_batch": {"micro_batch_size": 2},
    }
    if backend == "megatron":
        from hf_engines.megatron import MegatronEngine

        settings["megatron"] = {"expert_model_parallel_size": 2}
        return MegatronEngine(config_from_dict(EngineConfig, settings))
    return FSDPEngine(config_from_dict(EngineConfig, settings))


def run(backend: str, model_dir: str, out: Path) -> dict[str, Any]:
    """Log-probs, full parameters, a few steps' losses and grad norms, export."""
    engine = make_engine(backend, model_dir)
    probe = make_toy_batch(ROWS, seed=7)
    before, _ = engine.compute_log_prob(shard(probe))
    initial = {name: tensor.clone() for name, tensor in engine.iter_full_params()}
    metrics = []
    for step in range(STEPS):
        batch = make_toy_batch(ROWS, seed=100 + step)
        metrics.append(engine.train_step(shard(batch), toy_nll_loss))
    after, _ = engine.compute_log_prob(shard(probe))
    params = {name: tensor.clone() for name, tensor in engine.iter_full_params()}
    engine.export_hf(out / "hf")
    first = dist.get_rank() == 0
    return {
        "log_probs_before": before,
        "log_probs_after": after,
        "initial_params": initial if first else {},
        "params": params if first else {},
        "losses": [m["loss"] for m in metrics],
        "grad_norms": [m["grad_norm"] for m in metrics],
    }


def main() -> None:
    """Run the scenario named on the command line on this rank."""
    backend, model_dir, out_dir = sys.argv[1:4]
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    out = Path(out_dir)
    result = run(backend, model_dir, out)
    torch.save(result, out / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
