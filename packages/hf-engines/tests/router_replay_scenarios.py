"""Scenarios run as gloo ranks by test_megatron_router_replay.py (``launch_ranks``).

Usage: ``python router_replay_scenarios.py MODEL_DIR ROUTING_FILE OUT_DIR PP``: a Megatron
engine on the tiny Qwen3-MoE with ``PP`` pipeline stages and the other ranks as expert- and
data-parallel ones (1 rank; EP=2 on 2 ranks, where the rows split 3 / 2 over the replicas
and one runs a filler; or PP=2 on 2 ranks, one MoE layer per stage). ``ROUTING_FILE``
holds the probe batch's tensors and two recorded routings, ``own`` (what the model itself
chooses) and ``nudged`` (from a copy with perturbed routers). Each rank writes
``OUT_DIR/rank<r>.pt``: log-probs and one step's gradients without replay and with each.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hf_engines import EngineConfig, config_from_dict
from hf_engines.testing import toy_nll_loss
from hf_protocol import DataProto
from hf_protocol.routing import ROUTED_EXPERTS


def shard(batch: DataProto) -> DataProto:
    """This data-parallel replica's rows."""
    from megatron.core import parallel_state

    replicas = parallel_state.get_data_parallel_world_size()
    return batch.chunk(replicas)[parallel_state.get_data_parallel_rank()]


def gradients_of_one_step(engine: Any, batch: DataProto) -> tuple[dict[str, Any], float]:
    """The gradients the optimizer sees in one ``train_step``, and its loss."""
    seen: dict[str, torch.Tensor] = {}

    def keep(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for name, param in engine.model.named_parameters():
            if param.grad is not None:
                seen[name] = param.grad.detach().clone()

    handle = engine.optimizer.register_step_pre_hook(keep)
    metrics = engine.train_step(batch, toy_nll_loss)
    handle.remove()
    return seen, float(metrics["loss"])


def run(model_dir: str, routing_file: str, stages: int) -> dict[str, Any]:
    """Log-probs and gradients: without replay, replaying ``own``, replaying ``nudged``."""
    from hf_engines.megatron import MegatronEngine

    settings: dict[str, Any] = {
        "backend": "megatron",
        "model": {"path": model_dir},
        # lr 1e-12: the steps move the weights by ~1e-12, so every step sees the same model
        "optim": {"lr": 1e-12, "warmup_steps": 0, "weight_decay": 0.0},
        "micro_batch": {"micro_batch_size": 2},
        "megatron": {
            "pipeline_model_parallel_size": stages,
            "expert_model_parallel_size": dist.get_world_size() // stages,
        },
    }
    engine = MegatronEngine(config_from_dict(EngineConfig, settings))
    recorded = torch.load(routing_file, weights_only=False)
    batches = {}
    for name in ("plain", "own", "nudged"):
        tensors = dict(recorded["batch"])
        if name != "plain":
            tensors[ROUTED_EXPERTS] = recorded[name]
        batches[name] = shard(DataProto.from_dict(tensors=tensors))
    from megatron.core import parallel_state

    result: dict[str, Any] = {"stage": parallel_state.get_pipeline_model_parallel_rank()}
    for name, batch in batches.items():
        result[f"log_probs_{name}"] = engine.compute_log_prob(batch)[0]
    for name, batch in batches.items():
        result[f"grads_{name}"], result[f"loss_{name}"] = gradients_of_one_step(engine, batch)
    return result


def main() -> None:
    """Run the scenario on this rank."""
    model_dir, routing_file, out_dir, stages = sys.argv[1:5]
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    result = run(model_dir, routing_file, int(stages))
    torch.save(result, Path(out_dir) / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
