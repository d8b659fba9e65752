"""``CriticWorker``: value estimates and value-function updates."""

from __future__ import annotations

from dataclasses import dataclass

from hf_controller import register, release_host_memory
from hf_engines.engine import LossFn
from hf_engines.workers.actor import require_loss_fn
from hf_engines.workers.base import (
    ENGINE_DISPATCH,
    TrainableEngineWorker,
    check_head,
    metrics_proto,
)
from hf_engines.workers.updates import UpdateConfig, run_update
from hf_protocol import DataProto, fields


@dataclass(frozen=True)
class CriticConfig(UpdateConfig):
    """The critic: a value-head engine and how a batch is cut into optimizer steps."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_head("CriticWorker", self.engine, "value")


class CriticWorker(TrainableEngineWorker):
    """The value model as one rank of an SPMD group (FSDP2 or Megatron engine,
    ``model.head='value'``)."""

    def __init__(self, config: CriticConfig, loss_fn: LossFn | None = None) -> None:
        super().__init__(config.engine)
        self.config = config
        self.loss_fn = loss_fn

    @register(ENGINE_DISPATCH)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` ``(B, R)``: the value head at the positions predicting each response token."""
        return DataProto.from_dict(tensors={fields.VALUES: self.engine.compute_values(data)})

    @register(ENGINE_DISPATCH)
    def update_critic(self, data: DataProto) -> DataProto:
        """``ppo_epochs`` passes of mini-batch steps; metrics ``critic/<name>`` as lists."""
        loss_fn = require_loss_fn("CriticWorker", self.loss_fn)
        group = self.data_parallel.group
        metrics = run_update(self.engine, data, self.config, loss_fn, "critic", group)
        release_host_memory()  # the step's activations and logits, freed but still held
        return metrics_proto(metrics)
