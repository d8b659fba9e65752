"""SamplingConfig and RolloutConfig: defaults, ConfigurationError checks, dict construction,
pickling."""

from __future__ import annotations

import pickle

import pytest
import torch
from ray import cloudpickle

from hf_controller import ConfigurationError
from hf_protocol import DataProto
from hf_rollout import RolloutConfig, SamplingConfig


def test_sampling_defaults_match_the_contract() -> None:
    sampling = SamplingConfig()
    assert (sampling.n, sampling.temperature, sampling.top_p, sampling.top_k) == (1, 1.0, 1.0, -1)
    assert (sampling.max_new_tokens, sampling.stop_token_ids) == (32, ())
    assert (sampling.eos_token_id, sampling.seed, sampling.greedy) == (None, None, False)


def test_greedy_reports_temperature_one() -> None:
    assert SamplingConfig(greedy=True, temperature=0.3).effective_temperature == 1.0
    assert SamplingConfig(temperature=0.0).is_greedy
    assert SamplingConfig(temperature=0.7).effective_temperature == 0.7


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("n", 0, "n must be >= 1"),
        ("temperature", -1.0, "temperature must be >= 0"),
        ("top_p", 0.0, "top_p must be in (0, 1]"),
        ("top_k", 0, "top_k must be -1 (off) or >= 1"),
        ("max_new_tokens", 0, "max_new_tokens must be >= 1"),
    ],
)
def test_sampling_rejects_bad_values(field: str, value: object, words: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        SamplingConfig(**{field: value})  # type: ignore[arg-type]
    assert words in str(info.value) and f"got {value}" in str(info.value)


def test_sampling_from_dict_lists_valid_keys_on_a_typo() -> None:
    assert SamplingConfig.from_dict({"n": 2, "stop_token_ids": [3, 4]}).stop_token_ids == (3, 4)
    with pytest.raises(
        ConfigurationError, match=r"unknown key\(s\) \['temprature'\].*'temperature'"
    ):
        SamplingConfig.from_dict({"temprature": 0.5})


def test_sampling_pickles_as_itself_inside_a_request() -> None:
    """A driver sends the object in ``meta_info["sampling"]``; Ray pickles it as it is."""
    sampling = SamplingConfig(n=2, stop_token_ids=(3,), seed=5, greedy=True)
    request = DataProto.from_dict({"input_ids": torch.ones(2, 3)}, meta_info={"sampling": sampling})
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)):
        received = loads(dumps(request)).meta_info["sampling"]
        assert isinstance(received, SamplingConfig) and received == sampling


def test_rollout_config_needs_exactly_one_model_source() -> None:
    with pytest.raises(ConfigurationError, match="exactly one of model_path"):
        RolloutConfig()
    with pytest.raises(ConfigurationError, match="exactly one of model_path"):
        RolloutConfig(model_path="/x", model_config={"model_type": "qwen2"})
    with pytest.raises(ConfigurationError, match="needs a 'model_type'"):
        RolloutConfig(model_config={"hidden_size": 8})


def test_rollout_config_dtype_and_device() -> None:
    config = RolloutConfig(model_path="/x", dtype="bfloat16", device="cpu")
    assert config.torch_dtype is torch.bfloat16
    assert config.resolve_device() == torch.device("cpu")
    with pytest.raises(ConfigurationError, match=r"dtype 'fp8' is not supported; choose from"):
        RolloutConfig(model_path="/x", dtype="fp8")
    with pytest.raises(ConfigurationError, match=r"unknown key\(s\) \['modelpath'\]"):
        RolloutConfig.from_dict({"modelpath": "/x"})
