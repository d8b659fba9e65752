"""hf-engines: training engines behind one small interface (FSDP2 and Megatron-core).

Public names are imported on first use (PEP 562), so the light modules (``hf_engines.config``,
``hf_engines.hub``) do not import torch or transformers: a config can be read, checked and
composed before the heavy imports (the ``hybridflow`` command starts Ray meanwhile).
``MegatronEngine`` stays behind its optional extra (megatron-core) the same way.
"""

import importlib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
    from hf_engines.megatron import MegatronEngine
    from hf_engines.micro_batch import split_by_size, split_by_token_budget, split_micro_batches
    from hf_engines.optim import build_optimizer
    from hf_engines.schedule import build_lr_scheduler, lr_multiplier
    from hf_engines.workers import (
        ActorConfig,
        ActorWorker,
        CriticConfig,
        CriticWorker,
        ReferenceWorker,
        RewardModelWorker,
    )

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
    "build_optimizer",
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


_WHERE = {
    "ActorConfig": "hf_engines.workers",
    "ActorWorker": "hf_engines.workers",
    "CriticConfig": "hf_engines.workers",
    "CriticWorker": "hf_engines.workers",
    "EngineConfig": "hf_engines.config",
    "FSDPConfig": "hf_engines.config",
    "FSDPEngine": "hf_engines.fsdp",
    "LoRAConfig": "hf_engines.config",
    "LossFn": "hf_engines.engine",
    "LossOutput": "hf_engines.engine",
    "MegatronConfig": "hf_engines.config",
    "MegatronEngine": "hf_engines.megatron",
    "MicroBatchConfig": "hf_engines.config",
    "ModelConfig": "hf_engines.config",
    "ModelOutputs": "hf_engines.engine",
    "OptimConfig": "hf_engines.config",
    "ReferenceWorker": "hf_engines.workers",
    "RewardModelWorker": "hf_engines.workers",
    "TrainingEngine": "hf_engines.engine",
    "build_lr_scheduler": "hf_engines.schedule",
    "build_optimizer": "hf_engines.optim",
    "config_from_dict": "hf_engines.config",
    "entropy_from_logits": "hf_engines.logprob",
    "logprobs_from_logits": "hf_engines.logprob",
    "lr_multiplier": "hf_engines.schedule",
    "mini_batch_total": "hf_engines.engine",
    "response_log_probs": "hf_engines.logprob",
    "response_positions": "hf_engines.logprob",
    "split_by_size": "hf_engines.micro_batch",
    "split_by_token_budget": "hf_engines.micro_batch",
    "split_micro_batches": "hf_engines.micro_batch",
}
"""The module each public name lives in."""


def __getattr__(name: str) -> object:
    """Import the module of a public name on first use and keep the value here."""
    if name not in _WHERE:
        raise AttributeError(f"module 'hf_engines' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the public ones not imported yet included."""
    return sorted(set(globals()) | set(_WHERE))
