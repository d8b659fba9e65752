"""Scenarios run as N gloo ranks by test_fsdp_ulysses.py (``launch_ranks``), not collected.

Usage: ``python ulysses_scenarios.py {actor,lora,critic} MODEL_DIR OUT_DIR SP``. Each rank writes
``OUT_DIR/rank<r>.pt`` with what the tests compare.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hf_engines import EngineConfig, FSDPEngine, LoRAConfig, config_from_dict
from hf_engines.testing import join_launched_group, make_toy_batch, toy_nll_loss, toy_value_loss
from hf_engines.workers.distributed import shutdown_distributed
from hf_protocol import DataProto

STEPS = 3


def shard(batch: DataProto) -> DataProto:
    """This rank's rows, as a worker group's DP dispatch would send them."""
    return batch.chunk(dist.get_world_size())[dist.get_rank()]


def record_gradients(engine: FSDPEngine, into: list[dict[str, torch.Tensor]]) -> None:
    """Append each step's full (unsharded) gradients to ``into`` before the optimizer sees
    them: the engine's clip step is wrapped, every rank gathers (a collective)."""
    clip = engine._clip_gradients

    def clip_and_record() -> float:
        into.append(
            {
                name: param.grad.full_tensor().clone()
                for name, param in engine.model.named_parameters()
                if param.grad is not None
            }
        )
        return clip()

    engine._clip_gradients = clip_and_record  # type: ignore[method-assign]


def engine_for(model_dir: str, sp: int, head: str, lora: LoRAConfig | None = None) -> FSDPEngine:
    """An engine with ``sp``-way sequence parallelism, two rows per micro-batch (and
    ``lora`` adapters); the critic recomputes its activations in backward (the all-to-alls
    run again there)."""
    settings: dict[str, Any] = {
        "model": {"path": model_dir, "head": head, "seed": 3},
        "optim": {"lr": 1e-2},
        "micro_batch": {"micro_batch_size": 2},
        "fsdp": {
            "ulysses_sequence_parallel_size": sp,
            "activation_checkpointing": head == "value",
        },
    }
    return FSDPEngine(config_from_dict(EngineConfig, settings), lora)


def run_actor(model_dir: str, sp: int, lora: LoRAConfig | None = None) -> dict[str, Any]:
    """Log-probs and entropy of a 5-row probe (uneven over ranks), then training steps
    (of the ``lora`` adapters only, when given)."""
    engine = engine_for(model_dir, sp, "causal_lm", lora)
    grads: list[dict[str, torch.Tensor]] = []
    record_gradients(engine, grads)
    probe = make_toy_batch(5, prompt_length=9, response_length=7, seed=7)
    log_probs, entropy = engine.compute_log_prob(shard(probe), temperature=0.7)
    metrics = []
    for step in range(STEPS):
        batch = make_toy_batch(8, prompt_length=9, response_length=7, seed=100 + step)
        metrics.append(engine.train_step(shard(batch), toy_nll_loss))
    after, _ = engine.compute_log_prob(shard(probe))
    return {
        "log_probs": log_probs,
        "entropy": entropy,
        "metrics": metrics,
        "grads": grads,
        "log_probs_after": after,
    }


def run_critic(model_dir: str, sp: int) -> dict[str, Any]:
    """Values of a probe and value-loss steps of a value-head engine."""
    engine = engine_for(model_dir, sp, "value")
    probe = make_toy_batch(6, seed=7)  # 2/2/1/1 rows over four ranks
    values = engine.compute_values(shard(probe))
    losses = [engine.train_step(shard(probe), toy_value_loss)["loss"] for _ in range(STEPS)]
    return {"values": values, "losses": losses}


def main() -> None:
    """Run the scenario named on the command line on this rank."""
    scenario, model_dir, out_dir, sp = sys.argv[1:5]
    torch.use_deterministic_algorithms(True)
    join_launched_group()
    if scenario == "actor":
        result = run_actor(model_dir, int(sp))
    elif scenario == "lora":
        result = run_actor(model_dir, int(sp), LoRAConfig(rank=4, alpha=8.0))
    elif scenario == "critic":
        result = run_critic(model_dir, int(sp))
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    torch.save(result, Path(out_dir) / f"rank{dist.get_rank()}.pt")
    shutdown_distributed()


if __name__ == "__main__":
    main()
