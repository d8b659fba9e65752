"""LoRA scenario run as N gloo ranks by test_lora.py (``launch_ranks``), not collected.

Usage: ``python lora_scenarios.py MODEL_DIR OUT_DIR``. Each rank writes ``OUT_DIR/rank<r>.pt``
with what the tests compare; rank 0 also exports the model both ways under ``OUT_DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hf_engines import EngineConfig, FSDPEngine, LoRAConfig, config_from_dict
from hf_engines.lora import gather_adapter, lora_layers
from hf_engines.testing import join_launched_group, make_toy_batch, toy_nll_loss
from hf_engines.workers.distributed import shutdown_distributed
from hf_protocol import DataProto

LORA = LoRAConfig(rank=4, alpha=8.0)
STEPS = 4
CHECKPOINT_AFTER = 2


def shard(batch: DataProto) -> DataProto:
    """This rank's rows, as a worker group's DP dispatch would send them."""
    return batch.chunk(dist.get_world_size())[dist.get_rank()]


def train(engine: FSDPEngine, steps: range) -> list[float]:
    """Global losses of the given steps, each on its own toy mini-batch."""
    return [
        engine.train_step(shard(make_toy_batch(8, seed=100 + step)), toy_nll_loss)["loss"]
        for step in steps
    ]


def optimizer_state_bytes(engine: FSDPEngine) -> int:
    """Bytes of the AdamW state (exp_avg, exp_avg_sq, step) summed over every rank."""
    local = 0
    for param_state in engine.optimizer.state.values():
        for value in param_state.values():
            if isinstance(value, torch.Tensor):
                tensor = value.to_local() if isinstance(value, DTensor) else value
                local += tensor.numel() * tensor.element_size()
    total = torch.tensor([local], dtype=torch.int64)
    dist.all_reduce(total)
    return int(total.item())


def run(model_dir: str, out: Path) -> dict[str, Any]:
    """Train with LoRA, checkpoint, resume, export both ways; measure the AdamW state."""
    config = config_from_dict(
        EngineConfig,
        {
            "model": {"path": model_dir},
            "optim": {"lr": 1e-2},
            "micro_batch": {"micro_batch_size": 2},
        },
    )
    engine = FSDPEngine(config, LORA)
    names = {id(p): n for n, p in engine.model.named_parameters()}
    optimized = [names[id(p)] for group in engine.optimizer.param_groups for p in group["params"]]
    frozen = [n for n, p in engine.model.named_parameters() if not p.requires_grad]
    probe = make_toy_batch(5, seed=7)
    losses = train(engine, range(CHECKPOINT_AFTER))
    engine.save_checkpoint(out / "ckpt")
    losses += train(engine, range(CHECKPOINT_AFTER, STEPS))
    log_probs, _ = engine.compute_log_prob(shard(probe))
    base_log_probs, _ = engine.compute_base_log_prob(shard(probe))
    merged = {name: tensor.clone() for name, tensor in engine.iter_full_params()}
    adapter = gather_adapter(engine.model)
    state = {
        name: (t.full_tensor() if isinstance(t, DTensor) else t).clone()
        for name, t in engine.model.state_dict().items()
    }
    engine.export_hf(out / "merged")
    engine.export_adapter(out / "adapter")
    lora_bytes = optimizer_state_bytes(engine)

    resumed = FSDPEngine(config, LORA)
    resumed.load_checkpoint(out / "ckpt")
    checkpoint_log_probs, _ = resumed.compute_log_prob(shard(probe))
    resumed_losses = train(resumed, range(CHECKPOINT_AFTER, STEPS))

    full = FSDPEngine(config)  # the same model and steps, every weight trained
    train(full, range(STEPS))
    rank0 = dist.get_rank() == 0
    return {
        "optimized": optimized,
        "frozen": frozen,
        "losses": losses,
        "resumed_losses": resumed_losses,
        "resumed_step": resumed.global_step,
        "checkpoint_log_probs": checkpoint_log_probs,
        "log_probs": log_probs,
        "base_log_probs": base_log_probs,
        "merged": merged if rank0 else {},
        "adapter": adapter if rank0 else {},
        "state": state if rank0 else {},
        "layers": lora_layers(engine.model),
        "trainable_numel": sum(p.numel() for p in engine.trainable),
        "total_numel": sum(p.numel() for p in full.trainable),
        "lora_state_bytes": lora_bytes,
        "full_state_bytes": optimizer_state_bytes(full),
    }


def main() -> None:
    """Run the scenario on this rank and save its result."""
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    join_launched_group()
    try:
        result = run(model_dir, out)
        torch.save(result, out / f"rank{dist.get_rank()}.pt")
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main()
