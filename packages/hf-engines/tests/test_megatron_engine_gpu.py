"""The Megatron-core engine on CUDA with NCCL, 1 rank, TP=1: log-probs equal transformers.

Skipped without CUDA or without megatron-core. The scenario runs in its own process (this
file is also the scenario script: ``python test_megatron_engine_gpu.py MODEL_DIR OUT_DIR``),
with the process group started the way a worker starts it (``init_distributed``, ``nccl``).
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from hf_engines import EngineConfig, config_from_dict
from hf_engines.testing import launch_ranks, make_toy_batch, toy_nll_loss
from hf_engines.workers import init_distributed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SCRIPT = Path(__file__)
QUIET = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PYTHONWARNINGS": "ignore",
}
LAUNCH_TIMEOUT = 240.0
STEPS = 6


def run_scenario(model_dir: str) -> dict[str, Any]:
    """Log-probs of the probe batch, then ``STEPS`` steps on one fixed batch."""
    from hf_engines.megatron import MegatronEngine

    config = config_from_dict(
        EngineConfig,
        {
            "backend": "megatron",
            "model": {"path": model_dir},
            "megatron": {"device": "cuda"},
            "optim": {"lr": 1e-2},
            "micro_batch": {"micro_batch_size": 2},
        },
    )
    engine = MegatronEngine(config)
    probe = make_toy_batch(5, seed=7)
    before, entropy = engine.compute_log_prob(probe)
    batch = make_toy_batch(8, seed=100)
    losses = [engine.train_step(batch, toy_nll_loss)["loss"] for _ in range(STEPS)]
    return {
        "device": str(next(engine.model.parameters()).device),
        "log_probs_before": before,
        "entropy_before": entropy,
        "losses": losses,
    }


def main() -> None:
    """Run the scenario on this rank (launched by the test below)."""
    model_dir, out_dir = sys.argv[1:3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_distributed(rank, world, int(os.environ["LOCAL_RANK"]), device="cuda")
    result = run_scenario(model_dir)
    result["backend"] = str(dist.get_backend())
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def run(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The rank-0 result on the tiny Qwen2 (tied embeddings, q/k/v biases)."""
    pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")
    out = tmp_path_factory.mktemp("megatron-gpu")
    launch_ranks(SCRIPT, 1, [str(tiny_models["qwen2"]), str(out)], LAUNCH_TIMEOUT, QUIET)
    result: dict[str, Any] = torch.load(out / "rank0.pt", weights_only=False)
    return result


def test_runs_on_cuda_with_nccl(run: dict[str, Any]) -> None:
    assert run["backend"] == "nccl"
    assert run["device"] == "cuda:0"


def test_log_probs_equal_transformers(run: dict[str, Any], tiny_models: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models["qwen2"], dtype=torch.float32).cuda()
    batch = make_toy_batch(5, seed=7).batch
    responses, mask = batch["responses"], batch["response_mask"].float()
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"].cuda(),
            attention_mask=batch["attention_mask"].cuda(),
            position_ids=batch["position_ids"].cuda(),
        ).logits
    log_softmax = torch.log_softmax(logits[:, -responses.shape[1] - 1 : -1].float().cpu(), -1)
    expected = log_softmax.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    torch.testing.assert_close(run["log_probs_before"] * mask, expected * mask, atol=1e-4, rtol=0)
    torch.testing.assert_close(run["entropy_before"] * mask, entropy * mask, atol=1e-4, rtol=0)


def test_training_reduces_loss(run: dict[str, Any]) -> None:
    losses = run["losses"]
    assert all(torch.isfinite(torch.tensor(losses))), losses
    # One fixed batch at lr 1e-2: every step lowers the loss (about 4.8 -> 3.2 in 6 steps).
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < 0.8 * losses[0], losses


if __name__ == "__main__":
    main()
