"""Scenarios run as N gloo ranks by test_megatron_engine.py (``launch_ranks``), not collected.

Usage: ``python megatron_scenarios.py {train,critic} MODEL_DIR OUT_DIR TP PP``. Each rank
writes ``OUT_DIR/rank<r>.pt`` with what the tests compare. Every rank of a tensor /
pipeline group gets the same rows; data-parallel replicas get their own shard.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from hf_engines import EngineConfig, config_from_dict
from hf_engines.megatron import MegatronEngine
from hf_engines.testing import make_toy_batch, toy_nll_loss, toy_value_loss
from hf_protocol import DataProto

TRAIN_STEPS = 4
CHECKPOINT_AFTER = 2  # steps; resuming from it must replay steps 3 and 4 exactly
MINI_BATCH = 8


def shard(batch: DataProto) -> DataProto:
    """This data-parallel replica's rows (the same on every TP / PP rank of a replica)."""
    size = parallel_state.get_data_parallel_world_size()
    return batch.chunk(size)[parallel_state.get_data_parallel_rank()]


def make_config(model_dir: str, tp: int, pp: int, **model: Any) -> EngineConfig:
    """A Megatron engine config for the tiny model at ``model_dir``."""
    return config_from_dict(
        EngineConfig,
        {
            "backend": "megatron",
            "model": {"path": model_dir, **model},
            "megatron": {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp},
            "optim": {"lr": 1e-2, "warmup_steps": 1, "schedule": "cosine", "total_steps": 10},
            "micro_batch": {"micro_batch_size": 2},
        },
    )


def train_losses(engine: MegatronEngine, steps: range) -> list[float]:
    """Run the given steps (each on its own toy mini-batch) and return the global losses."""
    losses = []
    for step in steps:
        batch = make_toy_batch(MINI_BATCH, seed=100 + step)
        losses.append(engine.train_step(shard(batch), toy_nll_loss)["loss"])
    return losses


def run_train(model_dir: str, out: Path, tp: int, pp: int) -> dict[str, Any]:
    """Log-probs, parameters, training, checkpoint + resume and export."""
    config = make_config(model_dir, tp, pp)
    engine = MegatronEngine(config)
    probe = make_toy_batch(5, seed=7)
    before, entropy = engine.compute_log_prob(shard(probe))
    hot, _ = engine.compute_log_prob(shard(probe), temperature=0.7)
    initial = {name: tensor.clone() for name, tensor in engine.iter_full_params()}
    losses = train_losses(engine, range(CHECKPOINT_AFTER))
    engine.save_checkpoint(out / "ckpt")
    losses += train_losses(engine, range(CHECKPOINT_AFTER, TRAIN_STEPS))
    after, _ = engine.compute_log_prob(shard(probe))
    engine.export_hf(out / "hf")
    engine.save_checkpoint(out / "final")  # exported offline by test_export_checkpoint
    params = {name: tensor.clone() for name, tensor in engine.iter_full_params()}
    resumed = MegatronEngine(config)
    resumed.load_checkpoint(out / "ckpt")
    rank = dist.get_rank()
    return {
        "log_probs_before": before,
        "entropy_before": entropy,
        "log_probs_hot": hot,
        "initial_params": initial if rank == 0 else {},
        "param_names": list(params),
        "params": params if rank == 0 else {},
        "losses": losses,
        "log_probs_after": after,
        "resumed_step": resumed.global_step,
        "resumed_losses": train_losses(resumed, range(CHECKPOINT_AFTER, TRAIN_STEPS)),
        "dp_rank": parallel_state.get_data_parallel_rank(),
    }


def run_critic(model_dir: str, out: Path, tp: int, pp: int) -> dict[str, Any]:
    """A value-head engine: values, a few training steps, export."""
    engine = MegatronEngine(make_config(model_dir, tp, pp, head="value", seed=3))
    probe = make_toy_batch(5, seed=7)
    values = engine.compute_values(shard(probe))
    losses = [engine.train_step(shard(probe), toy_value_loss)["loss"] for _ in range(3)]
    engine.export_hf(out / "hf")
    return {
        "values": values,
        "losses": losses,
        "values_after": engine.compute_values(shard(probe)),
        "dp_rank": parallel_state.get_data_parallel_rank(),
    }


def main() -> None:
    """Run the scenario named on the command line on this rank."""
    scenario, model_dir, out_dir, tp, pp = sys.argv[1:6]
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    out = Path(out_dir)
    if scenario == "train":
        result = run_train(model_dir, out, int(tp), int(pp))
    elif scenario == "critic":
        result = run_critic(model_dir, out, int(tp), int(pp))
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    torch.save(result, out / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
