"""HF <-> megatron weight conversion as pure functions, and Megatron config checks.

The config checks need no megatron-core: they run before any process group exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from hf_controller import ConfigurationError
from hf_engines import EngineConfig, MegatronConfig, config_from_dict


def _engine_config(model_dir: Path, **megatron: object) -> EngineConfig:
    return config_from_dict(
        EngineConfig,
        {"backend": "megatron", "model": {"path": str(model_dir)}, "megatron": megatron},
    )


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "qwen3_moe"])
@pytest.mark.parametrize("tp", [1, 2])
def test_round_trip_through_tensor_parallel_shards_is_exact(
    tiny_models: dict[str, Path], family: str, tp: int
) -> None:
    pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")
    from hf_engines.megatron.convert import hf_to_mcore, mcore_to_hf, tp_merge, tp_shard

    model = AutoModelForCausalLM.from_pretrained(tiny_models[family])
    config = model.config
    hf_state = model.state_dict()
    full = hf_to_mcore(hf_state, config.num_hidden_layers, config.num_key_value_heads, False)
    assert ("output_layer.weight" in full) == (not config.tie_word_embeddings)
    merged = {}
    for name, tensor in full.items():
        shards = [tp_shard(name, tensor, rank, tp) for rank in range(tp)]
        if tp > 1 and name.endswith("linear_qkv.weight"):
            assert shards[0].shape[0] == tensor.shape[0] // tp
        merged[name] = tp_merge(name, shards)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    back = mcore_to_hf(
        merged, config.num_hidden_layers, config.num_key_value_heads, head_dim, False
    )
    assert set(back) == set(hf_state)
    for name, tensor in hf_state.items():
        assert torch.equal(back[name], tensor), name


def test_fused_qkv_groups_each_query_group_with_its_key_and_value() -> None:
    pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")
    from hf_engines.megatron.convert import hf_layer_to_mcore

    head_dim, hidden = 2, 3
    q = torch.arange(4 * head_dim * hidden).reshape(4 * head_dim, hidden).float()  # 4 heads
    k = -torch.arange(2 * head_dim * hidden).reshape(2 * head_dim, hidden).float() - 1
    v = k - 100
    layer = {
        "self_attn.q_proj.weight": q,
        "self_attn.k_proj.weight": k,
        "self_attn.v_proj.weight": v,
        "mlp.gate_proj.weight": torch.zeros(4, hidden),
        "mlp.up_proj.weight": torch.ones(4, hidden),
    }
    qkv = hf_layer_to_mcore(layer, num_query_groups=2)["self_attention.linear_qkv.weight"]
    group0 = torch.cat([q[: 2 * head_dim], k[:head_dim], v[:head_dim]])
    group1 = torch.cat([q[2 * head_dim :], k[head_dim:], v[head_dim:]])
    assert torch.equal(qkv, torch.cat([group0, group1]))


def test_megatron_config_rejects_a_split_the_model_cannot_take(
    tiny_models: dict[str, Path],
) -> None:
    with pytest.raises(ConfigurationError, match=r"tensor_model_parallel_size=3 .*heads=4"):
        _engine_config(tiny_models["llama"], tensor_model_parallel_size=3)
    with pytest.raises(ConfigurationError, match=r"pipeline_model_parallel_size=4 .*layers=2"):
        _engine_config(tiny_models["llama"], pipeline_model_parallel_size=4)
    with pytest.raises(ConfigurationError, match=r"megatron.layer_spec='te'"):
        _engine_config(tiny_models["llama"], layer_spec="te")
    with pytest.raises(ConfigurationError, match=r"unknown key.*megatron.tp"):
        _engine_config(tiny_models["llama"], tp=2)
    assert not dist.is_initialized()  # all of it before any process group


def test_megatron_config_rejects_an_unsupported_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ConfigurationError, match=r"model_type='gpt2'.*backend='fsdp'"):
        _engine_config(tmp_path)


def test_megatron_config_checks_the_world_size() -> None:
    config = MegatronConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    assert config.data_parallel_size(8) == 2
    with pytest.raises(ConfigurationError, match=r"world_size=6 .* multiple of 4"):
        config.data_parallel_size(6)


def test_fsdp_backend_ignores_the_megatron_layout(tiny_models: dict[str, Path]) -> None:
    config = config_from_dict(
        EngineConfig,
        {
            "model": {"path": str(tiny_models["llama"])},
            "megatron": {"tensor_model_parallel_size": 3},
        },
    )
    assert config.backend == "fsdp"


def test_moe_experts_convert_one_megatron_mlp_per_expert(tiny_models: dict[str, Path]) -> None:
    pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")
    from hf_engines.megatron.convert import hf_layer_to_mcore
    from hf_engines.megatron.moe import expert_index, with_expert_index

    state = AutoModelForCausalLM.from_pretrained(tiny_models["qwen3_moe"]).state_dict()
    layer = {k[len("model.layers.1.") :]: t for k, t in state.items() if ".layers.1." in k}
    converted = hf_layer_to_mcore(layer, 2)
    gate_up = layer["mlp.experts.gate_up_proj"]
    assert torch.equal(converted["mlp.router.weight"], layer["mlp.gate.weight"])
    for expert in range(4):
        fc1 = converted[f"mlp.experts.local_experts.{expert}.linear_fc1.weight"]
        assert torch.equal(fc1, gate_up[expert])  # gate rows then up rows, as megatron's fc1
    name = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight"
    assert expert_index(name) == 1 and expert_index("decoder.layers.0.mlp.router.weight") is None
    assert with_expert_index(name, 3) == name.replace(".1.", ".3.")


def test_expert_parallel_size_is_checked_against_the_model(tiny_models: dict[str, Path]) -> None:
    moe = tiny_models["qwen3_moe"]
    assert _engine_config(moe, expert_model_parallel_size=2).megatron.expert_model_parallel_size
    with pytest.raises(ConfigurationError, match="does not divide the model's num_experts=4"):
        _engine_config(moe, expert_model_parallel_size=3)
    with pytest.raises(ConfigurationError, match="tensor_model_parallel_size=1 only"):
        _engine_config(moe, tensor_model_parallel_size=2)
    with pytest.raises(ConfigurationError, match="needs a mixture-of-experts model"):
        _engine_config(tiny_models["llama"], expert_model_parallel_size=2)
    with pytest.raises(ConfigurationError, match="does not divide the 3 data-parallel ranks"):
        MegatronConfig(expert_model_parallel_size=2).data_parallel_size(3)
