# The one list of hf_engines's public names: type checkers read it as the package's stub, and
# lazy_loader.attach_stub (in __init__.py) imports each name from its module on first use.
from .config import EngineConfig as EngineConfig
from .config import FSDPConfig as FSDPConfig
from .config import LoRAConfig as LoRAConfig
from .config import MegatronConfig as MegatronConfig
from .config import MicroBatchConfig as MicroBatchConfig
from .config import ModelConfig as ModelConfig
from .config import OptimConfig as OptimConfig
from .config import config_from_dict as config_from_dict
from .engine import LossFn as LossFn
from .engine import LossOutput as LossOutput
from .engine import ModelOutputs as ModelOutputs
from .engine import TrainingEngine as TrainingEngine
from .engine import mini_batch_total as mini_batch_total
from .fsdp import FSDPEngine as FSDPEngine
from .logprob import entropy_from_logits as entropy_from_logits
from .logprob import logprobs_from_logits as logprobs_from_logits
from .logprob import response_log_probs as response_log_probs
from .logprob import response_positions as response_positions
from .megatron import MegatronEngine as MegatronEngine
from .micro_batch import split_by_size as split_by_size
from .micro_batch import split_by_token_budget as split_by_token_budget
from .micro_batch import split_micro_batches as split_micro_batches
from .optim import OptimHyper as OptimHyper
from .optim import build_optimizer as build_optimizer
from .schedule import build_lr_scheduler as build_lr_scheduler
from .schedule import lr_multiplier as lr_multiplier
from .workers import ActorConfig as ActorConfig
from .workers import ActorWorker as ActorWorker
from .workers import CriticConfig as CriticConfig
from .workers import CriticWorker as CriticWorker
from .workers import ReferenceWorker as ReferenceWorker
from .workers import RewardModelWorker as RewardModelWorker

__version__: str
