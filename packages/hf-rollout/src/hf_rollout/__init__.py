"""hf-rollout: generation engines (native torch, vLLM, SGLang) behind one small interface."""

from hf_rollout.base import (
    RolloutEngine,
    build_output_from_samples,
    build_rollout_output,
    check_prompt_lengths,
    mask_through_first_stop,
    read_prompts,
    stop_ids_for,
)
from hf_rollout.config import MultiTurnConfig, RolloutConfig, SamplingConfig
from hf_rollout.registry import (
    ROLLOUT_BACKENDS,
    build_rollout,
    register_rollout_backend,
    rollout_backend_class,
)
from hf_rollout.weight_channel import WeightChannel, WeightChannelError

__version__ = "0.1.0"

__all__ = [
    "ROLLOUT_BACKENDS",
    "MultiTurnConfig",
    "RolloutConfig",
    "RolloutEngine",
    "SamplingConfig",
    "WeightChannel",
    "WeightChannelError",
    "build_output_from_samples",
    "build_rollout",
    "build_rollout_output",
    "check_prompt_lengths",
    "mask_through_first_stop",
    "read_prompts",
    "register_rollout_backend",
    "rollout_backend_class",
    "stop_ids_for",
]
