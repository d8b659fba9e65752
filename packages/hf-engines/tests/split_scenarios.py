"""The Megatron engine's split step, run as 1 gloo rank by test_split_step.py
(``launch_ranks``), not collected.

Usage: ``python split_scenarios.py MODEL_DIR OUT_DIR``. Writes ``OUT_DIR/rank0.pt``: the
weights after one ``train_step`` over a batch and after ``forward_backward`` on each half
then one ``optim_step`` (a summed loss, so the halves' gradients add up to the whole's), and
both calls' metrics.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hf_engines import EngineConfig, config_from_dict
from hf_engines.testing import make_toy_batch, toy_sum_nll_loss

ROWS = 8


def weights(engine: Any) -> dict[str, torch.Tensor]:
    """The engine's full weights, Hugging Face names."""
    return {name: tensor.clone() for name, tensor in engine.iter_full_params()}


def run(model_dir: str) -> dict[str, Any]:
    """One ``train_step`` on the whole batch against two ``forward_backward`` + one
    ``optim_step`` on its halves, each on a fresh engine."""
    from hf_engines.megatron import MegatronEngine

    config = config_from_dict(
        EngineConfig,
        {
            "backend": "megatron",
            "model": {"path": model_dir},
            "optim": {"lr": 1e-3, "eps": 1e-4, "grad_clip": None},
            "micro_batch": {"micro_batch_size": 2},
        },
    )
    batch = make_toy_batch(ROWS, seed=3)
    whole = MegatronEngine(config)
    whole_metrics = whole.train_step(batch, toy_sum_nll_loss)
    split = MegatronEngine(config)
    halves = [split.forward_backward(half, toy_sum_nll_loss) for half in batch.chunk(2)]
    step = split.optim_step()
    return {
        "whole": weights(whole),
        "split": weights(split),
        "whole_metrics": whole_metrics,
        "half_losses": [half["loss"] for half in halves],
        "step": step,
        "global_step": split.global_step,
    }


def main() -> None:
    """Run the scenario on this rank."""
    model_dir, out_dir = sys.argv[1:3]
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    torch.save(run(model_dir), Path(out_dir) / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
