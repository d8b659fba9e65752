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


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
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
