"""ActorWorker on the Megatron engine through a real Ray worker group: 2 CPU ranks (gloo)
forming one tensor-parallel pair (TP=2, DP=1), so both ranks must receive the same rows
and the result must come from one of them. One group, a tiny Llama, a handful of tokens."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")

from hf_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from hf_engines import (
    ActorConfig,
    ActorWorker,
    EngineConfig,
    config_from_dict,
)
from hf_engines.testing import make_toy_batch, toy_nll_loss
from hf_engines.workers import ENGINE_MESH

ACTOR_METRICS = {"actor/nll", "actor/loss", "actor/grad_norm", "actor/lr"}
PROBE = make_toy_batch(5, seed=7)


def plain_log_probs(model_dir: Path) -> torch.Tensor:
    """Response log-probs of ``PROBE`` with plain transformers in this process, masked."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tensors = PROBE.batch
    responses = tensors["responses"]
    with torch.no_grad():
        logits = model(
            input_ids=tensors["input_ids"],
            attention_mask=tensors["attention_mask"],
            position_ids=tensors["position_ids"],
        ).logits.float()[:, -responses.shape[1] - 1 : -1]
    log_probs = torch.log_softmax(logits, -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    return log_probs * tensors["response_mask"]


def megatron_actor_config(model: Path) -> ActorConfig:
    engine = config_from_dict(
        EngineConfig,
        {
            "backend": "megatron",
            "model": {"path": str(model)},
            "megatron": {"tensor_model_parallel_size": 2, "device": "cpu"},
            "optim": {"lr": 1e-2},
            "micro_batch": {"micro_batch_size": 2},
        },
    )
    return ActorConfig(engine=engine, ppo_mini_batch_size=4, shuffle=True)


@pytest.mark.timeout(300)
def test_megatron_actor_tp2_through_mesh_dispatch(
    ray_session: Any, tiny_models: dict[str, Path]
) -> None:
    model_dir = tiny_models["llama"]
    group = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False),
        RayClassWithInitArgs(ActorWorker, megatron_actor_config(model_dir), loss_fn=toy_nll_loss),
    )
    group.init_model()
    # Both ranks are one data-parallel replica; only tensor-parallel rank 0 is gathered.
    assert group.dp_layout(ENGINE_MESH) == ([0, 0], [True, False])

    out = group.compute_log_prob(PROBE)
    assert out.batch["old_log_probs"].shape == (5, 5)  # 5 rows once, not once per rank
    torch.testing.assert_close(
        out.batch["old_log_probs"] * PROBE.batch["response_mask"],
        plain_log_probs(model_dir),
        atol=1e-4,
        rtol=0,
    )

    metrics = group.update_actor(make_toy_batch(8, seed=11)).meta_info["metrics"]
    assert set(metrics) == ACTOR_METRICS
    for name in ACTOR_METRICS:
        assert len(metrics[name]) == 2, name  # 8 rows / 4 per mini-batch, one replica
        assert all(math.isfinite(value) for value in metrics[name]), name
    assert group.global_step() == [2, 2]
