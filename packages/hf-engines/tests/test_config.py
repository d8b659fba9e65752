"""Config errors name the value and the fix, and happen before any process group starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from hf_controller import ConfigurationError
from hf_engines import (
    EngineConfig,
    FSDPConfig,
    FSDPEngine,
    MicroBatchConfig,
    ModelConfig,
    OptimConfig,
    config_from_dict,
)
from hf_engines.fsdp.sharding import syncs_at_last_micro_batch


def test_from_dict_builds_nested_configs(tiny_models: dict[str, Path]) -> None:
    config = config_from_dict(
        EngineConfig,
        {
            "model": {"path": str(tiny_models["llama"]), "dtype": "bfloat16"},
            "optim": {"lr": 1e-4, "betas": [0.9, 0.95]},
            "micro_batch": {"max_tokens": 512},
        },
    )
    assert config.model.dtype == "bfloat16"
    assert config.optim.betas == (0.9, 0.95)
    assert config.micro_batch.max_tokens == 512
    assert config.fsdp == FSDPConfig()


def test_unknown_key_is_named_with_the_valid_keys(tiny_models: dict[str, Path]) -> None:
    data = {"model": {"path": str(tiny_models["llama"])}, "optim": {"lrr": 1e-4}}
    valid = r"optim\.lrr.*valid keys: betas, eps, fused, grad_clip"
    with pytest.raises(ConfigurationError, match=valid):
        config_from_dict(EngineConfig, data)
    with pytest.raises(ConfigurationError, match=r"unknown key.*optimizer.*valid keys"):
        config_from_dict(EngineConfig, {"model": {"path": "x"}, "optimizer": {}})


def test_missing_model_section_is_named() -> None:
    with pytest.raises(ConfigurationError, match=r"missing required key.*model"):
        config_from_dict(EngineConfig, {})


def test_missing_model_path_names_the_path_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigurationError, match=f"{missing}.*does not exist.*save_pretrained"):
        config_from_dict(EngineConfig, {"model": {"path": str(missing)}})
    with pytest.raises(ConfigurationError, match=r"has no config.json"):
        ModelConfig(path=str(tmp_path))
    assert not dist.is_initialized()


def test_model_needs_exactly_one_source(tiny_models: dict[str, Path]) -> None:
    with pytest.raises(ConfigurationError, match=r"exactly one of model.path"):
        ModelConfig()
    with pytest.raises(ConfigurationError, match=r"exactly one of model.path"):
        ModelConfig(path=str(tiny_models["llama"]), hf_config={"model_type": "llama"})
    with pytest.raises(ConfigurationError, match=r"model_type"):
        ModelConfig(hf_config={"hidden_size": 32})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "fp8"}, "model.dtype='fp8'"),
        ({"head": "reward"}, "model.head='reward'"),
    ],
)
def test_bad_model_values_are_named(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ModelConfig(hf_config={"model_type": "llama"}, **kwargs)  # type: ignore[arg-type]


def test_bad_optim_values_are_named() -> None:
    with pytest.raises(ConfigurationError, match=r"optim.lr=-1"):
        OptimConfig(lr=-1)
    with pytest.raises(ConfigurationError, match=r"optim.total_steps=3 must be > optim.warmup"):
        OptimConfig(schedule="cosine", warmup_steps=5, total_steps=3)
    assert OptimConfig(schedule="cosine").total_steps is None  # a trainer sets it from the run
    with pytest.raises(ConfigurationError, match=r"optim.betas"):
        OptimConfig(betas=(0.9, 1.5))
    with pytest.raises(ConfigurationError, match=r"optim.schedule='linear'"):
        OptimConfig(schedule="linear")  # type: ignore[arg-type]


def test_micro_batch_sizes_are_positive_and_optional() -> None:
    # Nothing has to divide any more (uneven batches, short last micro-batch); neither
    # set means the automatic token budget.
    assert MicroBatchConfig(micro_batch_size=3).micro_batch_size == 3
    assert MicroBatchConfig(max_tokens=100).max_tokens == 100
    assert MicroBatchConfig() == MicroBatchConfig(micro_batch_size=None, max_tokens=None)
    with pytest.raises(ConfigurationError, match=r"micro_batch.micro_batch_size=0"):
        MicroBatchConfig(micro_batch_size=0)


def test_mesh_must_cover_the_world() -> None:
    assert FSDPConfig().mesh_shape(4) == (1, 4)
    assert FSDPConfig(dp_replicate=2).mesh_shape(4) == (2, 2)
    with pytest.raises(
        ConfigurationError, match=r"dp_replicate=3 x fsdp.dp_shard=-1.*world_size=4"
    ):
        FSDPConfig(dp_replicate=3).mesh_shape(4)


def test_gradients_are_reduced_once_per_step_only_where_that_costs_no_memory() -> None:
    auto = FSDPConfig()
    assert syncs_at_last_micro_batch(auto, 1)  # one rank: a shard is the whole gradient
    assert syncs_at_last_micro_batch(FSDPConfig(dp_replicate=2), 2)  # HSDP, dp_shard 1
    assert not syncs_at_last_micro_batch(auto, 2)
    assert not syncs_at_last_micro_batch(FSDPConfig(cpu_offload=True), 1)
    assert syncs_at_last_micro_batch(FSDPConfig(gradient_sync="last_micro_batch"), 4)
    assert not syncs_at_last_micro_batch(FSDPConfig(gradient_sync="every_micro_batch"), 1)


def test_bad_fsdp_values_are_named() -> None:
    with pytest.raises(ConfigurationError, match=r"fsdp.gradient_sync='never'.*'auto'"):
        FSDPConfig(gradient_sync="never")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"fsdp.blocks_per_unit=-1 must be >= 0"):
        FSDPConfig(blocks_per_unit=-1)
    assert FSDPConfig(blocks_per_unit=0).blocks_per_unit == 0  # the whole model, one unit


def test_engine_without_process_group_says_how_to_start_one() -> None:
    assert not dist.is_initialized()
    config = EngineConfig(model=ModelConfig(hf_config={"model_type": "llama"}))
    with pytest.raises(RuntimeError, match=r"init_process_group"):
        FSDPEngine(config)
