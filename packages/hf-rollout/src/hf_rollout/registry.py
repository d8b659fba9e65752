"""The rollout backends by name, imported lazily (vLLM and SGLang are optional extras)."""

from __future__ import annotations

import importlib
from typing import Any

from hf_controller import ConfigurationError
from hf_rollout.base import RolloutEngine
from hf_rollout.config import RolloutConfig

ROLLOUT_BACKENDS: dict[str, str] = {
    "native": "hf_rollout.backends.native:NativeRollout",
    "vllm": "hf_rollout.backends.vllm:VLLMRollout",
    "sglang": "hf_rollout.backends.sglang:SGLangRollout",
}
"""Backend name -> ``"module:Class"``; the class is imported only when built."""


def register_rollout_backend(name: str, target: str) -> None:
    """Add backend ``name`` implemented by ``"module:Class"``; a taken name is an error."""
    if name in ROLLOUT_BACKENDS:
        raise ValueError(
            f"rollout backend {name!r} is already registered as {ROLLOUT_BACKENDS[name]!r}; "
            "pick another name"
        )
    if ":" not in target:
        raise ValueError(f"backend target must look like 'module:Class', got {target!r}")
    ROLLOUT_BACKENDS[name] = target


def rollout_backend_class(name: str) -> type[Any]:
    """The class of backend ``name``; unknown names are an error listing the choices."""
    if name not in ROLLOUT_BACKENDS:
        raise ConfigurationError(
            f"unknown rollout backend {name!r}; choose one of {sorted(ROLLOUT_BACKENDS)}"
        )
    module_name, class_name = ROLLOUT_BACKENDS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(
            f"rollout backend {name!r} cannot be imported ({error}); install its extra, "
            f'e.g. pip install "hf-rollout[{name}]"'
        ) from error
    cls: type[Any] = getattr(module, class_name)
    return cls


def build_rollout(config: RolloutConfig) -> RolloutEngine:
    """Build the engine that ``config.backend`` names."""
    engine: RolloutEngine = rollout_backend_class(config.backend)(config)
    return engine
