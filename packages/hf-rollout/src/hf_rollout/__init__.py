"""hf-rollout: generation engines (native torch, vLLM, SGLang) behind one small interface."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

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
from hf_rollout.weight_sync import (
    WeightChannel,
    WeightChannelError,
    WeightIntegrityError,
    WeightLink,
    WeightPushError,
    WeightReceiver,
    WeightSender,
)

try:  # the installed distribution's version, so it cannot drift from pyproject.toml
    __version__ = _distribution_version("hf-rollout")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ROLLOUT_BACKENDS",
    "MultiTurnConfig",
    "RolloutConfig",
    "RolloutEngine",
    "SamplingConfig",
    "WeightChannel",
    "WeightChannelError",
    "WeightIntegrityError",
    "WeightLink",
    "WeightPushError",
    "WeightReceiver",
    "WeightSender",
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
