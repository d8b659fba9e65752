"""hf-engines: training engines behind one small interface (FSDP2 now; Megatron-core planned)."""

from hf_engines.config import (
    ConfigError,
    EngineConfig,
    FSDPConfig,
    MicroBatchConfig,
    ModelConfig,
    OptimConfig,
    config_from_dict,
)
from hf_engines.engine import LossFn, LossOutput, ModelOutputs, TrainingEngine
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

__version__ = "0.1.0"

__all__ = [
    "ActorConfig",
    "ActorWorker",
    "ConfigError",
    "CriticConfig",
    "CriticWorker",
    "EngineConfig",
    "FSDPConfig",
    "FSDPEngine",
    "LossFn",
    "LossOutput",
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
    "response_log_probs",
    "response_positions",
    "split_by_size",
    "split_by_token_budget",
    "split_micro_batches",
]
