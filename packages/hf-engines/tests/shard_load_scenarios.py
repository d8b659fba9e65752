"""Scenarios run as N gloo ranks by test_megatron_shard_load.py (``launch_ranks``), not collected.

Usage: ``python shard_load_scenarios.py load MODEL_DIR OUT_DIR TP PP`` compares this rank's
per-shard load with the full load; ``python shard_load_scenarios.py zero MODEL_DIR OUT_DIR PP``
trains (DP=2, or PP=2) with and without the distributed optimizer (checkpoint and resume
included). Each rank writes ``OUT_DIR/rank<r>.pt`` with what the tests compare.
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
from hf_engines.megatron.convert import hf_to_mcore
from hf_engines.megatron.model import build_gpt_model
from hf_engines.megatron.parallel import initialize_parallel
from hf_engines.megatron.shard_load import load_shards, shard_source
from hf_engines.megatron.weights import load_full_weights
from hf_engines.models import build_hf_model, build_meta_hf_model
from hf_engines.testing import make_toy_batch, toy_nll_loss

TRAIN_STEPS = 4
CHECKPOINT_AFTER = 2


def make_config(model_dir: str, tp: int, pp: int, **megatron: Any) -> EngineConfig:
    """A Megatron engine config for the tiny model at ``model_dir``."""
    return config_from_dict(
        EngineConfig,
        {
            "backend": "megatron",
            "model": {"path": model_dir},
            "megatron": {
                "tensor_model_parallel_size": tp,
                "pipeline_model_parallel_size": pp,
                **megatron,
            },
            "optim": {"lr": 1e-2, "warmup_steps": 1, "schedule": "cosine", "total_steps": 10},
            "micro_batch": {"micro_batch_size": 2},
        },
    )


def param_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters this rank holds."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the model's state (tensors only; megatron lists extra states as None)."""
    return {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


def run_load(model_dir: str, out: Path, tp: int, pp: int) -> dict[str, Any]:
    """This rank's stage loaded per shard and loaded from the full model, and their sizes."""
    config = make_config(model_dir, tp, pp)
    device = initialize_parallel(config.megatron)
    meta = build_meta_hf_model(config.model)
    hf_config = meta.config
    groups = hf_config.num_key_value_heads
    tied = bool(hf_config.tie_word_embeddings)
    source = shard_source(config.model, list(meta.state_dict()), tied)
    assert source is not None, "the tiny model directory holds safetensors"
    per_shard = build_gpt_model(hf_config, config.model, config.megatron, device)
    load_shards(per_shard, source, groups, value_head=False)
    full_model = build_hf_model(config.model)
    whole = hf_to_mcore(full_model.state_dict(), hf_config.num_hidden_layers, groups, False)
    from_full = build_gpt_model(hf_config, config.model, config.megatron, device)
    load_full_weights(from_full, whole)
    return {
        "per_shard": tensors(per_shard),
        "from_full": tensors(from_full),
        "tp_attributes": {
            name: bool(getattr(p, "tensor_model_parallel", False))
            for name, p in per_shard.named_parameters()
        },
        "full_tp_attributes": {
            name: bool(getattr(p, "tensor_model_parallel", False))
            for name, p in from_full.named_parameters()
        },
        "stage_bytes": param_bytes(per_shard),
        "model_bytes": param_bytes(full_model),
    }


def train(engine: MegatronEngine, steps: range) -> list[float]:
    """The global loss of each step (each on its own toy mini-batch, split by replica)."""
    size = parallel_state.get_data_parallel_world_size()
    rank = parallel_state.get_data_parallel_rank()
    losses = []
    for step in steps:
        batch = make_toy_batch(8, seed=100 + step).chunk(size)[rank]
        losses.append(engine.train_step(batch, toy_nll_loss)["loss"])
    return losses


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in the optimizer's state (moments), on this rank."""
    return sum(
        value.numel() * value.element_size()
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    )


def run_zero(model_dir: str, out: Path, pp: int) -> dict[str, Any]:
    """Training with and without the distributed optimizer, and a resume of each.

    On 2 ranks: DP=2 with ``pp=1``; with ``pp=2`` the two pipeline ends split the optimizer
    state of a tied embedding.
    """
    result: dict[str, Any] = {}
    for distributed in (False, True):
        config = make_config(model_dir, 1, pp, use_distributed_optimizer=distributed)
        engine = MegatronEngine(config)
        losses = train(engine, range(CHECKPOINT_AFTER))
        engine.save_checkpoint(out / f"ckpt-{distributed}")
        losses += train(engine, range(CHECKPOINT_AFTER, TRAIN_STEPS))
        key = "zero" if distributed else "plain"
        result[key] = losses
        result[f"{key}_state_bytes"] = optimizer_state_bytes(engine.optimizer)
        result[f"{key}_params"] = tensors(engine.model)
        resumed = MegatronEngine(config)
        resumed.load_checkpoint(out / f"ckpt-{distributed}")
        result[f"{key}_resumed"] = train(resumed, range(CHECKPOINT_AFTER, TRAIN_STEPS))
    return result


def main() -> None:
    """Entry point of one rank; see the module docstring for the arguments."""
    scenario, model_dir, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    dist.init_process_group("gloo")
    if scenario == "load":
        result = run_load(model_dir, out, int(sys.argv[4]), int(sys.argv[5]))
    elif scenario == "zero":
        result = run_zero(model_dir, out, int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown scenario {scenario!r}; use load or zero")
    result["rank"] = dist.get_rank()
    torch.save(result, out / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
