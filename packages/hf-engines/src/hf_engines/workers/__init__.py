"""Engine role workers: each role is its own ``hf_controller.Worker`` class.

``ActorWorker``, ``CriticWorker``, ``ReferenceWorker`` and ``RewardModelWorker`` take and
return ``DataProto`` batches through registered methods; colocating roles in one process
is done by ``hf_controller.create_colocated_worker_cls_fused``.
"""

from hf_engines.workers.actor import ActorConfig, ActorWorker
from hf_engines.workers.base import EngineWorker, TrainableEngineWorker
from hf_engines.workers.critic import CriticConfig, CriticWorker
from hf_engines.workers.distributed import init_distributed, pick_backend
from hf_engines.workers.reference import ReferenceWorker
from hf_engines.workers.reward_model import RewardModelWorker
from hf_engines.workers.updates import UpdateConfig, count_mini_batches, split_mini_batches

__all__ = [
    "ActorConfig",
    "ActorWorker",
    "CriticConfig",
    "CriticWorker",
    "EngineWorker",
    "ReferenceWorker",
    "RewardModelWorker",
    "TrainableEngineWorker",
    "UpdateConfig",
    "count_mini_batches",
    "init_distributed",
    "pick_backend",
    "split_mini_batches",
]
