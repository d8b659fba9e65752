"""Run hf_algos loss functions through a real FSDPEngine (gloo ranks); not collected.

Usage: ``python engine_loss_scenarios.py MODEL_DIR OUT_DIR``. Writes ``OUT_DIR/rank<r>.pt``
with metrics and log-prob summaries that test_engine_integration.py checks.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hf_algos.losses import critic_loss, dpo_loss_fn, ppo_actor_loss
from hf_engines import EngineConfig, FSDPEngine, config_from_dict
from hf_engines.testing import make_toy_batch
from hf_protocol import DataProto

STEPS = 4


def engine(model_dir: str, head: str = "causal_lm") -> FSDPEngine:
    """A tiny-model engine with a large learning rate, so a few steps move it."""
    config = config_from_dict(
        EngineConfig,
        {
            "model": {"path": model_dir, "head": head, "seed": 1},
            "optim": {"lr": 1e-2},
            "micro_batch": {"micro_batch_size": 2},
        },
    )
    return FSDPEngine(config)


def sequence_log_probs(actor: FSDPEngine, batch: DataProto) -> torch.Tensor:
    """Sum of response log-probs per row."""
    log_probs, _ = actor.compute_log_prob(batch)
    return (log_probs * batch.batch["response_mask"]).sum(-1)


def run_ppo(model_dir: str) -> dict[str, Any]:
    """Positive advantages on rows 0-3, negative on 4-7: their log-probs must separate."""
    actor = engine(model_dir)
    batch = make_toy_batch(8, seed=3)
    old, _ = actor.compute_log_prob(batch)
    sign = torch.tensor([1.0] * 4 + [-1.0] * 4).unsqueeze(-1)
    batch.batch["old_log_probs"] = old
    batch.batch["ref_log_prob"] = old.clone()
    batch.batch["advantages"] = sign * batch.batch["response_mask"]
    loss_fn = functools.partial(
        ppo_actor_loss,
        clip_low=0.2,
        clip_high=0.28,
        entropy_coeff=1e-3,
        use_kl_loss=True,
        kl_loss_coef=1e-3,
    )
    before = sequence_log_probs(actor, batch)
    metrics = [actor.train_step(batch, loss_fn) for _ in range(STEPS)]
    return {"before": before, "after": sequence_log_probs(actor, batch), "metrics": metrics}


def run_dpo(model_dir: str) -> dict[str, Any]:
    """Adjacent pairs (even row chosen): the implicit reward margin must grow."""
    actor = engine(model_dir)
    batch = make_toy_batch(8, seed=5)
    ref, _ = actor.compute_log_prob(batch)
    batch.batch["ref_log_prob"] = ref
    loss_fn = functools.partial(dpo_loss_fn, beta=0.5)
    return {"metrics": [actor.train_step(batch, loss_fn) for _ in range(STEPS)]}


def run_critic(model_dir: str) -> dict[str, Any]:
    """Returns one above the first values: the clipped value loss must fall."""
    critic = engine(model_dir, head="value")
    batch = make_toy_batch(8, seed=7)
    values = critic.compute_values(batch)
    batch.batch["values"] = values
    batch.batch["returns"] = (values + 1.0) * batch.batch["response_mask"]
    loss_fn = functools.partial(critic_loss, cliprange_value=0.5)
    return {"metrics": [critic.train_step(batch, loss_fn) for _ in range(STEPS)]}


def main() -> None:
    """Run every scenario on this rank and save what the test checks."""
    model_dir, out_dir = sys.argv[1:3]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    result = {"ppo": run_ppo(model_dir), "dpo": run_dpo(model_dir), "critic": run_critic(model_dir)}
    torch.save(result, Path(out_dir) / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
