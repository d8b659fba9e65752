"""A tiny Qwen3-MoE trained by FSDP (1 rank) and by Megatron with 2 expert-parallel ranks.

Both runs (moe_scenarios.py, as gloo subprocesses on the CPU) see the same rows: Megatron
splits them 3 / 2 over its two data-parallel replicas, so one replica runs a filler
micro-batch to keep the experts' token exchange in step. Losses, gradient norms, log-probs
and trained weights must agree, and the Megatron export must load back as the same model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")

from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hf_engines.testing import launch_ranks, make_toy_batch

pytestmark = pytest.mark.second_lane

SCENARIOS = Path(__file__).with_name("moe_scenarios.py")
QUIET = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PYTHONWARNINGS": "ignore",
}
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def runs(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``fsdp``: the 1-rank result; ``megatron``: both ranks' results; and their outputs."""
    root = tmp_path_factory.mktemp("moe-runs")
    results: dict[str, Any] = {"root": root}
    for backend, ranks in (("fsdp", 1), ("megatron", 2)):
        out = root / backend
        out.mkdir()
        launch_ranks(
            SCENARIOS, ranks, [backend, str(tiny_models["qwen3_moe"]), str(out)], 300, QUIET
        )
        results[backend] = [
            torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(ranks)
        ]
    return results


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=TOLERANCE)


def test_expert_parallel_losses_and_grad_norms_match_fsdp(runs: dict[str, Any]) -> None:
    (fsdp,) = runs["fsdp"]
    for rank in runs["megatron"]:
        assert rank["losses"] == pytest.approx(fsdp["losses"], abs=TOLERANCE)
        assert rank["grad_norms"] == pytest.approx(fsdp["grad_norms"], abs=TOLERANCE)
    assert fsdp["losses"][1] < fsdp["losses"][0]


def test_expert_parallel_log_probs_match_fsdp(runs: dict[str, Any]) -> None:
    (fsdp,) = runs["fsdp"]
    mask = make_toy_batch(5, seed=7).batch["response_mask"]
    for key in ("log_probs_before", "log_probs_after"):
        megatron = torch.cat([rank[key] for rank in runs["megatron"]])
        _close(megatron * mask, fsdp[key] * mask)


def test_expert_parallel_weights_round_trip_and_train_like_fsdp(
    runs: dict[str, Any], tiny_models: dict[str, Path]
) -> None:
    (fsdp,) = runs["fsdp"]
    megatron = runs["megatron"][0]
    source = AutoModelForCausalLM.from_pretrained(tiny_models["qwen3_moe"]).state_dict()
    assert list(megatron["initial_params"]) == list(source)
    for name, tensor in source.items():  # HF -> megatron (experts split) -> HF is exact
        assert torch.equal(megatron["initial_params"][name], tensor), name
    for name, tensor in fsdp["params"].items():
        _close(megatron["params"][name], tensor)


def test_expert_parallel_export_loads_as_the_trained_model(runs: dict[str, Any]) -> None:
    megatron = runs["megatron"][0]["params"]
    exported = AutoModelForCausalLM.from_pretrained(runs["root"] / "megatron" / "hf").state_dict()
    assert set(exported) == set(megatron)
    for name, tensor in exported.items():
        assert torch.equal(tensor, megatron[name]), name
    files = list((runs["root"] / "megatron" / "hf").glob("*.safetensors"))
    fsdp_files = list((runs["root"] / "fsdp" / "hf").glob("*.safetensors"))
    assert sorted(load_file(files[0])) == sorted(load_file(fsdp_files[0]))
