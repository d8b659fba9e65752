"""Single-process pieces of the memory-saving Megatron load and optimizer (fast, no ranks)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")

from hf_controller import ConfigurationError
from hf_engines import ModelConfig
from hf_engines.config import MegatronConfig
from hf_engines.megatron.convert import hf_to_mcore, same_storage
from hf_engines.megatron.shard_load import shard_source
from hf_engines.megatron.zero import partition_parameters
from hf_engines.models import build_meta_hf_model
from hf_protocol.testing import tiny_decoder_config

SMOLLM2_SHAPE = {
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_meta_model_has_no_storage_and_keeps_ties(
    tiny_models: dict[str, Path], family: str
) -> None:
    model = build_meta_hf_model(ModelConfig(path=str(tiny_models[family])))
    assert all(p.is_meta for p in model.parameters())
    state = model.state_dict()
    tied = same_storage(state["lm_head.weight"], state["model.embed_tokens.weight"])
    assert tied == (family == "qwen2")
    full = hf_to_mcore(state, 2, 2, value_head=False)
    assert ("output_layer.weight" in full) == (family == "llama")


def test_same_storage_on_real_tensors() -> None:
    a = torch.zeros(3)
    assert same_storage(a, a.detach())
    assert not same_storage(a, torch.zeros(3))
    assert not same_storage(a, torch.zeros(3, device="meta"))


def test_shard_source_needs_safetensors(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    config = ModelConfig(path=str(tiny_models["llama"]))
    names = list(build_meta_hf_model(config).state_dict())
    assert shard_source(config, names, tied=False) == tiny_models["llama"]
    random = ModelConfig(hf_config=tiny_decoder_config("llama"))
    assert shard_source(random, names, tied=False) is None
    assert shard_source(config, [*names, "score.weight"], tied=False) is None  # a new head


def test_partition_balances_sizes() -> None:
    owners = partition_parameters([100, 10, 60, 50], 2)
    assert owners == [0, 0, 1, 1]  # 100 + 10 and 60 + 50
    with pytest.raises(ValueError, match="use fewer data-parallel ranks"):
        partition_parameters([1], 2)


def test_tensor_parallel_refusal_names_the_sizes_that_work() -> None:
    """SmolLM2-135M's 9 heads and 3 KV heads split over 1 or 3 ranks, not 2."""
    with pytest.raises(
        ConfigurationError, match="num_attention_heads=9; sizes that divide this model: 1, 3"
    ):
        MegatronConfig(tensor_model_parallel_size=2).validate_model(SMOLLM2_SHAPE)
    MegatronConfig(tensor_model_parallel_size=3).validate_model(SMOLLM2_SHAPE)
    with pytest.raises(ConfigurationError, match="sizes that divide this model: 1, 2, 3, 5, 6"):
        MegatronConfig(pipeline_model_parallel_size=4).validate_model(SMOLLM2_SHAPE)
