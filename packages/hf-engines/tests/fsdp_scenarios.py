"""Scenarios run as N gloo ranks by test_fsdp_engine.py (``launch_ranks``), not collected.

Usage: ``python fsdp_scenarios.py {train,critic,variants} MODEL_DIR OUT_DIR [RESUME_FROM]``.
Each rank writes ``OUT_DIR/rank<r>.pt`` with what the tests compare.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hf_engines import (
    EngineConfig,
    FSDPEngine,
    config_from_dict,
)
from hf_engines.testing import join_launched_group, make_toy_batch, toy_nll_loss, toy_value_loss
from hf_engines.workers.distributed import shutdown_distributed
from hf_protocol import DataProto

TRAIN_STEPS = 4
CHECKPOINT_AFTER = 2  # steps; resuming from it must replay steps 3 and 4 exactly
MINI_BATCH = 8


def shard(batch: DataProto) -> DataProto:
    """This rank's rows, as a worker group's DP dispatch would send them."""
    return batch.chunk(dist.get_world_size())[dist.get_rank()]


def train_losses(engine: FSDPEngine, steps: range) -> list[float]:
    """Run the given steps (each on its own toy mini-batch) and return the global losses."""
    losses = []
    for step in steps:
        batch = make_toy_batch(MINI_BATCH, seed=100 + step)
        losses.append(engine.train_step(shard(batch), toy_nll_loss)["loss"])
    return losses


def run_train(model_dir: str, out: Path, resume_from: str | None) -> dict[str, Any]:
    """Log-probs, training, checkpoint + resume, export and full-parameter iteration."""
    config = config_from_dict(
        EngineConfig,
        {
            "model": {"path": model_dir},
            "optim": {"lr": 1e-2, "warmup_steps": 1, "schedule": "cosine", "total_steps": 10},
            "micro_batch": {"micro_batch_size": 2},
        },
    )
    engine = FSDPEngine(config)
    probe = make_toy_batch(5, seed=7)  # 5 rows: 3/2 over two ranks, uneven micro-batches
    before, entropy = engine.compute_log_prob(shard(probe))
    losses = train_losses(engine, range(CHECKPOINT_AFTER))
    engine.save_checkpoint(out / "ckpt")
    losses += train_losses(engine, range(CHECKPOINT_AFTER, TRAIN_STEPS))
    after, _ = engine.compute_log_prob(shard(probe))
    engine.export_hf(out / "hf")
    engine.save_checkpoint(out / "final")  # exported offline by test_export_checkpoint
    params = {name: tensor.clone() for name, tensor in engine.iter_full_params()}

    resumed = FSDPEngine(config)
    resumed.load_checkpoint(out / "ckpt")
    result: dict[str, Any] = {
        "log_probs_before": before,
        "entropy_before": entropy,
        "losses": losses,
        "log_probs_after": after,
        "param_names": list(params),
        "params": params if dist.get_rank() == 0 else {},
        "resumed_step": resumed.global_step,
        "resumed_losses": train_losses(resumed, range(CHECKPOINT_AFTER, TRAIN_STEPS)),
    }
    if resume_from is not None:
        other = FSDPEngine(config)
        other.load_checkpoint(resume_from)
        result["cross_resumed_losses"] = train_losses(other, range(CHECKPOINT_AFTER, TRAIN_STEPS))
    return result


def run_critic(model_dir: str, out: Path) -> dict[str, Any]:
    """A value-head engine with a token budget, so ranks get different micro-batch counts."""
    config = config_from_dict(
        EngineConfig,
        {
            "model": {"path": model_dir, "head": "value", "seed": 3},
            "optim": {"lr": 1e-2},
            "micro_batch": {"micro_batch_size": None, "max_tokens": 12},
            "fsdp": {"activation_checkpointing": True},
        },
    )
    engine = FSDPEngine(config)
    probe = make_toy_batch(5, seed=7)
    values = engine.compute_values(shard(probe))
    losses = [engine.train_step(shard(probe), toy_value_loss)["loss"] for _ in range(3)]
    engine.export_hf(out / "hf")
    return {"values": values, "losses": losses}


VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "fused_adamw": {"optim": {"lr": 1e-2, "fused": True}},
    "two_blocks_per_unit": {"fsdp": {"blocks_per_unit": 2}},
    "whole_model_one_unit": {"fsdp": {"blocks_per_unit": 0}},
    "sync_every_micro_batch": {"fsdp": {"gradient_sync": "every_micro_batch"}},
    "sync_at_last_kept_gathered": {
        "fsdp": {"gradient_sync": "last_micro_batch", "reshard_after_forward": False}
    },
}
"""The host-overhead variants the GPU script compares (``bench_engine_mfu.py``)."""


def run_variants(model_dir: str) -> dict[str, Any]:
    """Train one engine per :data:`VARIANTS` entry on the same batches; their losses."""
    losses, synced_at_last = {}, {}
    for name, overrides in VARIANTS.items():
        settings: dict[str, Any] = {
            "model": {"path": model_dir},
            "optim": {"lr": 1e-2},
            "micro_batch": {"micro_batch_size": 2},
        }
        settings.update(overrides)
        engine = FSDPEngine(config_from_dict(EngineConfig, settings))
        losses[name] = train_losses(engine, range(TRAIN_STEPS))
        synced_at_last[name] = engine._sync_at_last
    return {"losses": losses, "synced_at_last": synced_at_last}


def main() -> None:
    """Run the scenario named on the command line on this rank."""
    scenario, model_dir, out_dir = sys.argv[1:4]
    resume_from = sys.argv[4] if len(sys.argv) > 4 else None
    torch.use_deterministic_algorithms(True)
    join_launched_group()
    out = Path(out_dir)
    if scenario == "train":
        result = run_train(model_dir, out, resume_from)
    elif scenario == "critic":
        result = run_critic(model_dir, out)
    elif scenario == "variants":
        result = run_variants(model_dir)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    torch.save(result, out / f"rank{dist.get_rank()}.pt")
    shutdown_distributed()


if __name__ == "__main__":
    main()
