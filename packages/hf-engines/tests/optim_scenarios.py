"""Scenarios run as N gloo ranks by test_optim.py (``launch_ranks``), not collected.

Usage: ``python optim_scenarios.py PARTS MODEL_DIR OUT_DIR [RESUME_FROM]``, ``PARTS`` a
comma-separated list of ``exact``, ``fsdp``, ``lora`` and ``megatron`` (run in this order, in one
process: the imports cost more than the tiny engines). Each rank writes
``OUT_DIR/rank<r>.pt`` with what the tests compare. Every engine here trains with
``optim.name='muon'``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from hf_engines import EngineConfig, FSDPEngine, LoRAConfig, config_from_dict
from hf_engines.optim import MUON_ADJUST_LR, FullMatrixMuon, MuonWithAdamW
from hf_engines.testing import make_toy_batch, toy_nll_loss
from hf_protocol import DataProto

TRAIN_STEPS = 3
CHECKPOINT_AFTER = 1  # steps; resuming from it (momentum saved) must replay steps 2, 3 exactly
MINI_BATCH = 8
OPTIM = {
    "name": "muon",
    "lr": 1e-2,
    "warmup_steps": 1,
    "schedule": "cosine",
    "total_steps": 10,
}


def shard(batch: DataProto) -> DataProto:
    """This rank's rows, as a worker group's DP dispatch would send them."""
    return batch.chunk(dist.get_world_size())[dist.get_rank()]


def train_losses(engine: Any, steps: range) -> list[float]:
    """Run the given steps (each on its own toy mini-batch) and return the global losses."""
    losses = []
    for step in steps:
        batch = make_toy_batch(MINI_BATCH, seed=100 + step)
        losses.append(engine.train_step(shard(batch), toy_nll_loss)["loss"])
    return losses


def muon_names(engine: Any) -> list[str]:
    """Names of the parameters the engine's Muon part steps."""
    optimizer = engine.optimizer
    assert isinstance(optimizer, MuonWithAdamW), type(optimizer)
    names = {id(param): name for name, param in engine.model.named_parameters()}
    return [names[id(param)] for group in optimizer.muon.param_groups for param in group["params"]]


def train_resume(engine: Any, rebuild: Any, out: Path) -> dict[str, Any]:
    """Train with a checkpoint after :data:`CHECKPOINT_AFTER` steps, then resume it."""
    losses = train_losses(engine, range(CHECKPOINT_AFTER))
    engine.save_checkpoint(out / "ckpt")
    losses += train_losses(engine, range(CHECKPOINT_AFTER, TRAIN_STEPS))
    params = {name: tensor.clone() for name, tensor in engine.iter_full_params()}
    resumed = rebuild()
    resumed.load_checkpoint(out / "ckpt")
    return {
        "muon_names": muon_names(engine),
        "losses": losses,
        "params": params if dist.get_rank() == 0 else {},
        "resumed_losses": train_losses(resumed, range(CHECKPOINT_AFTER, TRAIN_STEPS)),
    }


def fsdp_config(model_dir: str) -> EngineConfig:
    """The FSDP2 engine config of every scenario here."""
    return config_from_dict(
        EngineConfig,
        {"model": {"path": model_dir}, "optim": OPTIM, "micro_batch": {"micro_batch_size": 2}},
    )


def run_fsdp(model_dir: str, out: Path, resume_from: str | None) -> dict[str, Any]:
    """Training with checkpoint + resume (and resuming ``resume_from``, if given)."""
    config = fsdp_config(model_dir)
    result = train_resume(FSDPEngine(config), lambda: FSDPEngine(config), out / "fsdp")
    if resume_from is not None:
        other = FSDPEngine(config)
        other.load_checkpoint(resume_from)
        result["cross_resumed_losses"] = train_losses(other, range(CHECKPOINT_AFTER, TRAIN_STEPS))
    return result


def run_lora(model_dir: str) -> dict[str, Any]:
    """A LoRA engine's first steps: Muon steps the adapters, nothing is left for AdamW."""
    lora = LoRAConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))
    engine = FSDPEngine(fsdp_config(model_dir), lora)
    return {
        "muon_names": muon_names(engine),
        "has_adamw": engine.optimizer.adamw is not None,
        "losses": train_losses(engine, range(TRAIN_STEPS)),
    }


def run_exact() -> dict[str, Any]:
    """Muon's step on DTensor shards against the step on the full tensors, same inputs.

    Uneven, tall and wide matrices, sharded over every rank along dim 0 (as FSDP2 does):
    ``exact`` is whether :class:`FullMatrixMuon` gave the full-tensor result bit for bit,
    ``torch_max_diff`` how far torch's ``Muon`` run on the shards themselves lands.
    """
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    generator = torch.Generator().manual_seed(0)
    result: dict[str, Any] = {"exact": [], "torch_max_diff": []}
    for shape in ((48, 32), (32, 48), (7, 5)):
        start = torch.randn(shape, generator=generator)
        grads = [torch.randn(shape, generator=generator) for _ in range(2)]
        full = _muon_steps(FullMatrixMuon, start, grads, None)
        sharded = _muon_steps(FullMatrixMuon, start, grads, mesh)
        by_torch = _muon_steps(torch.optim.Muon, start, grads, mesh)
        result["exact"].append(torch.equal(sharded, full))
        result["torch_max_diff"].append(float((by_torch - full).abs().max()))
    return result


def _muon_steps(
    cls: type[torch.optim.Muon], start: torch.Tensor, grads: list[torch.Tensor], mesh: Any
) -> torch.Tensor:
    """The full weight after Muon steps with ``grads`` from ``start``, sharded on ``mesh``."""

    def place(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone() if mesh is None else distribute_tensor(tensor, mesh, [Shard(0)])

    param = torch.nn.Parameter(place(start))
    optimizer = cls([param], lr=0.1, weight_decay=0.1, adjust_lr_fn=MUON_ADJUST_LR)
    for grad in grads:
        param.grad = place(grad)
        optimizer.step()
    weight = param.detach()
    return weight.full_tensor() if isinstance(weight, DTensor) else weight


def run_megatron(model_dir: str, out: Path) -> dict[str, Any]:
    """The Megatron engine (tensor parallel 1) with checkpoint + resume."""
    from hf_engines.megatron import MegatronEngine

    config = config_from_dict(
        EngineConfig,
        {
            "backend": "megatron",
            "model": {"path": model_dir},
            "optim": OPTIM,
            "micro_batch": {"micro_batch_size": 2},
        },
    )
    return train_resume(MegatronEngine(config), lambda: MegatronEngine(config), out / "megatron")


def main() -> None:
    """Run the scenario named on the command line on this rank."""
    parts, model_dir, out_dir = sys.argv[1:4]
    resume_from = sys.argv[4] if len(sys.argv) > 4 else None
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    out = Path(out_dir)
    result: dict[str, Any] = {}
    for part in parts.split(","):
        if part == "exact":
            result[part] = run_exact()
        elif part == "fsdp":
            result[part] = run_fsdp(model_dir, out, resume_from)
        elif part == "lora":
            result[part] = run_lora(model_dir)
        elif part == "megatron":
            result[part] = run_megatron(model_dir, out)
        else:
            raise SystemExit(f"unknown scenario part {part!r}")
    torch.save(result, out / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
