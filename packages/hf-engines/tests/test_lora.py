"""LoRA on the FSDP2 engine (peft adapters), on real gloo ranks: 2 ranks and 1 rank.

One launch per world size (scenario in lora_scenarios.py) feeds every test below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hf_controller import ConfigurationError
from hf_engines import EngineConfig, LoRAConfig, ModelConfig
from hf_engines.config import check_lora_backend
from hf_engines.lora import is_adapter_dir, load_merged_model, merged_weight
from hf_engines.testing import launch_ranks, make_toy_batch, transformers_log_probs

SCENARIO = Path(__file__).with_name("lora_scenarios.py")
QUIET = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def _launch(world_size: int, model: Path, out: Path) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    launch_ranks(SCENARIO, world_size, [str(model), str(out)], 180.0, QUIET)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


@pytest.fixture(scope="module")
def runs(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The scenario on the tied-embedding Qwen2 at 2 ranks and at 1 rank."""
    root = tmp_path_factory.mktemp("lora-runs")
    model = tiny_models["qwen2"]
    return {
        "two": _launch(2, model, root / "two"),
        "one": _launch(1, model, root / "one"),
        "root": root,
        "model": model,
    }


def _probe_log_probs(model: torch.nn.Module) -> torch.Tensor:
    """Masked response log-probs of the probe batch under plain transformers."""
    probe = make_toy_batch(5, seed=7)
    log_probs, _ = transformers_log_probs(model, probe)
    return log_probs * probe.batch["response_mask"]


def _engine_log_probs(ranks: list[dict[str, Any]], key: str) -> torch.Tensor:
    mask = make_toy_batch(5, seed=7).batch["response_mask"]
    return torch.cat([rank[key] for rank in ranks]) * mask


def test_only_adapter_parameters_are_in_the_optimizer(runs: dict[str, Any]) -> None:
    rank = runs["two"][0]
    assert rank["optimized"] and all(".lora_A." in n or ".lora_B." in n for n in rank["optimized"])
    assert len(rank["optimized"]) == 2 * len(rank["layers"])
    assert any("embed_tokens" in n for n in rank["frozen"])
    assert all(".lora_" not in n for n in rank["frozen"])
    # all-linear: every projection of both blocks, never the output head
    assert len(rank["layers"]) == 2 * 7 and not any("lm_head" in n for n in rank["layers"])


@pytest.mark.parametrize("world", ["one", "two"])
def test_merged_weights_are_base_plus_scaled_adapter(runs: dict[str, Any], world: str) -> None:
    rank = runs[world][0]
    base = AutoModelForCausalLM.from_pretrained(runs["model"]).state_dict()
    merged, state = rank["merged"], rank["state"]
    assert set(merged) == set(base)  # the base model's own names, no adapter tensors
    for name, layer in rank["layers"].items():
        assert torch.equal(state[layer.base], base[name])  # training left the base untouched
        expected = base[name] + layer.scale * state[layer.lora_b] @ state[layer.lora_a]
        torch.testing.assert_close(merged[name], expected)
        assert not torch.equal(merged[name], base[name])  # the adapters did learn
    unadapted = [n for n in base if n not in rank["layers"]]
    assert all(torch.equal(merged[n], base[n]) for n in unadapted)


def test_merged_weight_transposes_fan_in_fan_out() -> None:
    base, lora_a, lora_b = torch.randn(3, 2), torch.randn(4, 3), torch.randn(2, 4)
    merged = merged_weight(base, lora_a, lora_b, 0.5, transpose=True)
    torch.testing.assert_close(merged, base + 0.5 * (lora_b @ lora_a).T)


def test_two_ranks_train_like_one(runs: dict[str, Any]) -> None:
    one, two = runs["one"][0]["losses"], runs["two"][0]["losses"]
    assert one == pytest.approx(two, rel=1e-5)
    trained = _engine_log_probs(runs["two"], "log_probs")
    torch.testing.assert_close(trained, _engine_log_probs(runs["one"], "log_probs"))
    # the adapters learnt the toy task: the probe's responses are likelier than under the base
    assert trained.sum() > _engine_log_probs(runs["two"], "base_log_probs").sum()


@pytest.mark.parametrize("world", ["one", "two"])
def test_checkpoint_holds_the_adapter_and_resumes_exactly(runs: dict[str, Any], world: str) -> None:
    rank = runs[world][0]
    assert rank["resumed_step"] == 4
    assert rank["resumed_losses"] == pytest.approx(rank["losses"][2:], rel=1e-6)
    ckpt = runs["root"] / world / "ckpt"
    assert is_adapter_dir(ckpt / "adapter")
    from torch.distributed.checkpoint import FileSystemReader

    keys = list(FileSystemReader(str(ckpt / "dcp")).read_metadata().state_dict_metadata)
    weights = [key for key in keys if key.startswith("model.")]
    assert weights and all(".lora_" in key for key in weights), weights[:5]
    assert not [key for key in keys if "base_layer" in key or "embed_tokens" in key]


def test_base_log_probs_are_the_reference_policy(runs: dict[str, Any]) -> None:
    base = AutoModelForCausalLM.from_pretrained(runs["model"])
    expected = _probe_log_probs(base)
    for world in ("one", "two"):
        got = _engine_log_probs(runs[world], "base_log_probs")
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("world", ["one", "two"])
def test_export_merged_and_adapter_load_with_transformers_and_peft(
    runs: dict[str, Any], world: str
) -> None:
    trained = _engine_log_probs(runs[world], "log_probs")
    out = runs["root"] / world
    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    torch.testing.assert_close(_probe_log_probs(merged), trained, atol=1e-5, rtol=1e-5)

    assert sorted(p.name for p in (out / "adapter").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert all(
        "base_layer" not in k for k in load_file(out / "adapter" / "adapter_model.safetensors")
    )
    with_adapter = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(runs["model"]), out / "adapter"
    )
    torch.testing.assert_close(_probe_log_probs(with_adapter), trained, atol=1e-5, rtol=1e-5)
    # the checkpoint's adapter/ is the policy of step 2, as the resumed engine saw it
    from_checkpoint = load_merged_model(out / "ckpt" / "adapter")
    at_checkpoint = _engine_log_probs(runs[world], "checkpoint_log_probs")
    torch.testing.assert_close(
        _probe_log_probs(from_checkpoint), at_checkpoint, atol=1e-5, rtol=1e-5
    )


def test_offline_export_of_a_lora_checkpoint_merges_its_adapter(runs: dict[str, Any]) -> None:
    from hf_engines.export import export_engine_checkpoint

    out = export_engine_checkpoint(runs["root"] / "two" / "ckpt", runs["root"] / "exported")
    assert not (out / "adapter_config.json").exists()
    exported = AutoModelForCausalLM.from_pretrained(out)
    at_checkpoint = _engine_log_probs(runs["two"], "checkpoint_log_probs")
    torch.testing.assert_close(_probe_log_probs(exported), at_checkpoint, atol=1e-5, rtol=1e-5)


def test_lora_optimizer_state_shrinks_by_the_parameter_ratio(runs: dict[str, Any]) -> None:
    for world in ("one", "two"):
        rank = runs[world][0]
        ratio = rank["trainable_numel"] / rank["total_numel"]
        # exp_avg + exp_avg_sq per trained parameter (float32), plus a scalar step each
        assert rank["lora_state_bytes"] / rank["full_state_bytes"] == pytest.approx(ratio, rel=0.02)
        assert rank["lora_state_bytes"] < 0.2 * rank["full_state_bytes"]


def test_lora_config_checks_its_values() -> None:
    assert not LoRAConfig().enabled
    assert LoRAConfig(rank=8, target_modules=["q_proj", "v_proj"]).target_modules == (  # type: ignore[arg-type]
        "q_proj",
        "v_proj",
    )
    with pytest.raises(ConfigurationError, match=r"lora\.rank=-1"):
        LoRAConfig(rank=-1)
    with pytest.raises(ConfigurationError, match=r"lora\.dropout"):
        LoRAConfig(rank=4, dropout=1.0)
    with pytest.raises(ConfigurationError, match="mixes 'all-linear'"):
        LoRAConfig(rank=4, target_modules=("all-linear", "q_proj"))


def test_megatron_and_value_heads_refuse_lora(tiny_models: dict[str, Path]) -> None:
    model = ModelConfig(path=str(tiny_models["llama"]))
    lora = LoRAConfig(rank=4)
    with pytest.raises(ConfigurationError, match="set backend='fsdp'"):
        check_lora_backend(lora, EngineConfig(model=model, backend="megatron"), "actor")
    critic = EngineConfig(model=ModelConfig(path=str(tiny_models["llama"]), head="value"))
    with pytest.raises(ConfigurationError, match=r"lora\.rank=0"):
        check_lora_backend(lora, critic, "critic")
    check_lora_backend(LoRAConfig(), EngineConfig(model=model, backend="megatron"), "actor")
