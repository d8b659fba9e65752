"""The backend registry: lazy lookup, errors that list the choices, no duplicates."""

from __future__ import annotations

import pytest

from hf_rollout import (
    ROLLOUT_BACKENDS,
    RolloutConfig,
    RolloutEngine,
    build_rollout,
    register_rollout_backend,
)
from hf_rollout.backends.native import NativeRollout
from hf_rollout.testing import tiny_model_config


def test_unknown_backend_lists_the_choices() -> None:
    config = RolloutConfig(backend="tgi", model_config=tiny_model_config())
    with pytest.raises(
        ValueError, match=r"unknown rollout backend 'tgi'; choose one of \["
    ) as info:
        build_rollout(config)
    for name in ("native", "sglang", "vllm"):
        assert name in str(info.value)


def test_duplicate_registration_is_an_error() -> None:
    with pytest.raises(ValueError, match="'native' is already registered"):
        register_rollout_backend("native", "somewhere:Else")
    assert ROLLOUT_BACKENDS["native"] == "hf_rollout.backends.native:NativeRollout"


def test_build_native_from_a_config_dict() -> None:
    engine = build_rollout(RolloutConfig(model_config=tiny_model_config("llama")))
    assert isinstance(engine, NativeRollout)
    assert isinstance(engine, RolloutEngine)
    engine.shutdown()
