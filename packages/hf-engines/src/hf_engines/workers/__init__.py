"""Engine role workers: each role is its own ``hf_controller.Worker`` class.

``ActorWorker``, ``CriticWorker``, ``ReferenceWorker`` and ``RewardModelWorker`` take and
return ``DataProto`` batches through registered methods; colocating roles in one process
is done by ``hf_controller.create_colocated_worker_cls_fused``. The ``DataProto`` methods
dispatch through the mesh ``ENGINE_MESH``: one shard per data-parallel replica, so the
tensor / pipeline parallel ranks of a Megatron replica share its rows.
"""

from hf_engines.workers.actor import ActorConfig, ActorWorker
from hf_engines.workers.base import EngineWorker, TrainableEngineWorker
from hf_engines.workers.critic import CriticConfig, CriticWorker
from hf_engines.workers.distributed import init_distributed, pick_backend, shutdown_distributed
from hf_engines.workers.mesh import ENGINE_MESH, DataParallelPlace, data_parallel_place
from hf_engines.workers.reference import ReferenceWorker
from hf_engines.workers.reward_model import RewardModelWorker
from hf_engines.workers.updates import (
    FILLER_ROWS,
    UpdateConfig,
    count_mini_batches,
    filler_rows,
    mini_batch_ranges,
    shuffle_seed,
    split_mini_batches,
)

__all__ = [
    "ENGINE_MESH",
    "FILLER_ROWS",
    "ActorConfig",
    "ActorWorker",
    "CriticConfig",
    "CriticWorker",
    "DataParallelPlace",
    "EngineWorker",
    "ReferenceWorker",
    "RewardModelWorker",
    "TrainableEngineWorker",
    "UpdateConfig",
    "count_mini_batches",
    "data_parallel_place",
    "filler_rows",
    "init_distributed",
    "mini_batch_ranges",
    "pick_backend",
    "shuffle_seed",
    "shutdown_distributed",
    "split_mini_batches",
]
