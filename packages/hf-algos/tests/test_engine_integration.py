"""The loss functions through a real FSDPEngine train step (one gloo rank, tiny Llama)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hf_engines.testing import build_tiny_model, launch_ranks

SCENARIOS = Path(__file__).with_name("engine_loss_scenarios.py")
QUIET = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("engine-losses")
    model = build_tiny_model(root / "llama", "llama")
    launch_ranks(SCENARIOS, 1, [str(model), str(root)], timeout=240.0, env=QUIET)
    loaded: dict[str, Any] = torch.load(root / "rank0.pt", weights_only=False)
    return loaded


@pytest.mark.timeout(300)
def test_ppo_actor_loss_moves_log_probs_with_the_advantage_sign(result: dict[str, Any]) -> None:
    ppo = result["ppo"]
    change = ppo["after"] - ppo["before"]
    assert (change[:4] > 0).all() and (change[4:] < 0).all(), change
    first = ppo["metrics"][0]
    for name in ("pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "kl_loss", "grad_norm", "lr"):
        assert name in first
    # On-policy first step: ratio 1, so nothing is clipped and the policy has not moved.
    assert first["pg_clipfrac"] == 0.0 and abs(first["ppo_kl"]) < 1e-5


@pytest.mark.timeout(300)
def test_dpo_loss_fn_grows_the_margin(result: dict[str, Any]) -> None:
    metrics = result["dpo"]["metrics"]
    assert metrics[0]["reward_margin"] == pytest.approx(0.0, abs=1e-5)  # policy == reference
    assert metrics[-1]["reward_margin"] > 0.0
    assert metrics[-1]["dpo_loss"] < metrics[0]["dpo_loss"]


@pytest.mark.timeout(300)
def test_critic_loss_falls(result: dict[str, Any]) -> None:
    metrics = result["critic"]["metrics"]
    assert metrics[-1]["vf_loss"] < metrics[0]["vf_loss"]
    assert {"vf_loss", "vf_clipfrac", "vpred_mean"} <= set(metrics[0])
