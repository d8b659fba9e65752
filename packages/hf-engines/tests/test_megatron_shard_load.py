"""Memory that divides: per-shard loading and the distributed optimizer, on gloo ranks (CPU).

Four launches (scenarios in shard_load_scenarios.py): TP=2 x PP=2 on 4 ranks for the tiny
Qwen2 (tied embeddings, q/k/v biases) and Llama, each comparing every rank's per-shard load
with the full load; and training with and without the distributed optimizer on 2 ranks, at
DP=2 (Llama) and at PP=2 (Qwen2, whose tied embedding copies split their optimizer state).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")

from hf_engines.testing import launch_ranks

pytestmark = pytest.mark.second_lane

SCENARIOS = Path(__file__).with_name("shard_load_scenarios.py")
QUIET = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PYTHONWARNINGS": "ignore",
}
LAUNCH_TIMEOUT = 360.0


def _launch(ranks: int, args: list[str], out: Path) -> list[dict[str, Any]]:
    out.mkdir()
    launch_ranks(SCENARIOS, ranks, [*args[:2], str(out), *args[2:]], LAUNCH_TIMEOUT, QUIET)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(ranks)]


@pytest.fixture(scope="module")
def loads(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    """Per family, every rank's per-shard and full-load parameters at TP=2 x PP=2."""
    root = tmp_path_factory.mktemp("shard-load")
    return {
        family: _launch(4, ["load", str(tiny_models[family]), "2", "2"], root / family)
        for family in ("qwen2", "llama")
    }


@pytest.fixture(scope="module")
def zero(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    """Both ranks' runs with and without the distributed optimizer, at DP=2 and at PP=2."""
    root = tmp_path_factory.mktemp("zero")
    return {
        "dp2": _launch(2, ["zero", str(tiny_models["llama"]), "1"], root / "dp2"),
        "pp2": _launch(2, ["zero", str(tiny_models["qwen2"]), "2"], root / "pp2"),
    }


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_per_shard_load_equals_full_load(
    loads: dict[str, list[dict[str, Any]]], family: str
) -> None:
    for rank in loads[family]:
        per_shard, from_full = rank["per_shard"], rank["from_full"]
        assert per_shard.keys() == from_full.keys()
        for name, tensor in per_shard.items():
            assert torch.equal(tensor, from_full[name]), (family, rank["rank"], name)
        assert rank["tp_attributes"] == rank["full_tp_attributes"]
    # ranks 0, 1: stage 0 (TP ranks 0, 1); ranks 2, 3: stage 1. With tied embeddings the
    # last stage's output layer is its copy of the first stage's embedding shard.
    for tp_rank in (0, 1):
        first = loads[family][tp_rank]["per_shard"]["embedding.word_embeddings.weight"]
        last = loads[family][2 + tp_rank]["per_shard"]["output_layer.weight"]
        assert torch.equal(first, last) == (family == "qwen2")


@pytest.mark.timeout(900)
def test_each_rank_holds_a_quarter_of_the_model(loads: dict[str, list[dict[str, Any]]]) -> None:
    """Untied Llama at TP=2 x PP=2: at most 1/4 of the parameters per rank, +10% (norms)."""
    for rank in loads["llama"]:
        assert rank["stage_bytes"] <= rank["model_bytes"] / 4 * 1.1, rank["stage_bytes"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", ["dp2", "pp2"])
def test_distributed_optimizer_matches_replicated(
    zero: dict[str, list[dict[str, Any]]], layout: str
) -> None:
    for rank in zero[layout]:
        torch.testing.assert_close(rank["zero"], rank["plain"], rtol=1e-6, atol=0)
        for name, value in rank["plain_params"].items():
            torch.testing.assert_close(rank["zero_params"][name], value, rtol=1e-6, atol=1e-7)
    assert zero[layout][0]["zero"] == zero[layout][1]["zero"]


def test_distributed_optimizer_halves_the_state(zero: dict[str, list[dict[str, Any]]]) -> None:
    ranks = zero["dp2"]
    for rank in ranks:
        assert rank["zero_state_bytes"] <= rank["plain_state_bytes"] / 2 * 1.05
    total = sum(rank["zero_state_bytes"] for rank in ranks)
    assert total == ranks[0]["plain_state_bytes"]  # every moment is kept exactly once


def test_pipeline_ends_split_the_tied_embedding_state(
    zero: dict[str, list[dict[str, Any]]],
) -> None:
    """Qwen2 at PP=2: each end keeps moments for half its embedding copy's rows."""
    for rank in zero["pp2"]:
        embedding = rank["plain_params"].get(
            "embedding.word_embeddings.weight", rank["plain_params"].get("output_layer.weight")
        )
        saved = 2 * embedding.numel() * embedding.element_size() // 2  # two moments, half
        assert rank["zero_state_bytes"] == rank["plain_state_bytes"] - saved


@pytest.mark.parametrize("layout", ["dp2", "pp2"])
def test_distributed_optimizer_resume_replays(
    zero: dict[str, list[dict[str, Any]]], layout: str
) -> None:
    for rank in zero[layout]:
        assert rank["zero_resumed"] == rank["zero"][2:]
        assert rank["plain_resumed"] == rank["plain"][2:]
