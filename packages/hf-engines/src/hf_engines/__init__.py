"""hf-engines: training engines behind one small interface (FSDP2 and Megatron-core)."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version
from typing import TYPE_CHECKING

from hf_engines.config import (
    EngineConfig,
    FSDPConfig,
    LoRAConfig,
    MegatronConfig,
    MicroBatchConfig,
    ModelConfig,
    OptimConfig,
    config_from_dict,
)
from hf_engines.engine import (
    LossFn,
    LossOutput,
    ModelOutputs,
    TrainingEngine,
    mini_batch_total,
)
from hf_engines.fsdp import FSDPEngine
from hf_engines.logprob import (
    entropy_from_logits,
    logprobs_from_logits,
    response_log_probs,
    response_positions,
)
from hf_engines.micro_batch import split_by_size, split_by_token_budget, split_micro_batches
from hf_engines.schedule import build_lr_scheduler, lr_multiplier
from hf_engines.workers import (
    ActorConfig,
    ActorWorker,
    CriticConfig,
    CriticWorker,
    ReferenceWorker,
    RewardModelWorker,
)

if TYPE_CHECKING:  # the real import is lazy (see __getattr__): megatron-core is optional
    from hf_engines.megatron import MegatronEngine

try:  # the installed distribution's version, so it cannot drift from pyproject.toml
    __version__ = _distribution_version("hf-engines")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ActorConfig",
    "ActorWorker",
    "CriticConfig",
    "CriticWorker",
    "EngineConfig",
    "FSDPConfig",
    "FSDPEngine",
    "LoRAConfig",
    "LossFn",
    "LossOutput",
    "MegatronConfig",
    "MegatronEngine",
    "MicroBatchConfig",
    "ModelConfig",
    "ModelOutputs",
    "OptimConfig",
    "ReferenceWorker",
    "RewardModelWorker",
    "TrainingEngine",
    "build_lr_scheduler",
    "config_from_dict",
    "entropy_from_logits",
    "logprobs_from_logits",
    "lr_multiplier",
    "mini_batch_total",
    "response_log_probs",
    "response_positions",
    "split_by_size",
    "split_by_token_budget",
    "split_micro_batches",
]


def __getattr__(name: str) -> object:
    """Import ``MegatronEngine`` only when asked for: megatron-core is an optional extra."""
    if name == "MegatronEngine":
        from hf_engines.megatron import MegatronEngine

        return MegatronEngine
    raise AttributeError(f"module 'hf_engines' has no attribute {name!r}")
