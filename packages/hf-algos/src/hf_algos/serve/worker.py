"""``TinkerActorWorker``: the actor role with the Tinker primitives.

A training client of ``hybridflow serve`` is a group of these (FSDP or Megatron, as the
config says); each method is collective over the group, and rows are split over the
data-parallel ranks like any actor call. ``forward_backward`` accumulates gradients,
``optim_step`` applies them with the Adam parameters of the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hf_algos.serve.batch import LOSS_CONFIG, LOSS_FN, ROW, input_column
from hf_algos.serve.losses import tinker_loss
from hf_algos.trainers.roles.sync_actor import SyncActorWorker
from hf_controller import Dispatch, register, release_host_memory
from hf_engines import OptimHyper
from hf_engines.engine import ModelOutputs
from hf_engines.workers.base import ENGINE_DISPATCH
from hf_protocol import DataProto, fields

LOG_PROBS = "tinker/log_probs"
"""Result column: the target log-probs, ``(B, R)`` float32."""


def _inputs(micro_batch: DataProto, width: int) -> dict[str, torch.Tensor]:
    """The loss inputs of ``micro_batch`` cut to the response ``width`` the engine used."""
    assert micro_batch.batch is not None
    prefix = input_column("")
    inputs: dict[str, torch.Tensor] = {}
    for key, value in micro_batch.batch.items():
        if isinstance(value, torch.Tensor) and key.startswith(prefix) and value.dim() == 2:
            inputs[key.removeprefix(prefix)] = value[:, :width]
    return inputs


class TinkerActorWorker(SyncActorWorker):
    """A :class:`~hf_algos.trainers.roles.sync_actor.SyncActorWorker` that also serves the
    Tinker ``forward_backward`` / ``forward`` / ``optim_step`` calls."""

    def _tinker_loss_fn(
        self, loss_fn: str, config: Mapping[str, float], captured: dict[int, torch.Tensor]
    ) -> Any:
        """The engine loss of one call: Tinker's summed loss; each row's log-probs kept in
        ``captured`` by request row."""

        def loss(outputs: ModelOutputs, micro_batch: DataProto) -> tuple[torch.Tensor, dict]:
            assert micro_batch.batch is not None
            log_probs = outputs["log_probs"]
            mask = micro_batch.batch[fields.RESPONSE_MASK][:, : log_probs.shape[1]]
            for index, row in enumerate(micro_batch.batch[ROW].tolist()):
                captured[int(row)] = log_probs[index].detach().float()
            inputs = _inputs(micro_batch, log_probs.shape[1])
            return tinker_loss(loss_fn, log_probs, inputs, config, mask), {}

        return loss

    @register(ENGINE_DISPATCH)
    def tinker_forward_backward(self, data: DataProto) -> DataProto:
        """Accumulate the gradients of ``data``'s loss (``meta_info`` names it); returns the
        target log-probs ``(B, R)`` of this rank's rows."""
        assert data.batch is not None
        captured: dict[int, torch.Tensor] = {}
        loss = self._tinker_loss_fn(
            str(data.meta_info[LOSS_FN]), dict(data.meta_info.get(LOSS_CONFIG, {})), captured
        )
        self.engine.forward_backward(data, loss)
        release_host_memory()
        width = data.batch[fields.RESPONSES].shape[1]
        rows = data.batch[ROW].tolist()
        log_probs = torch.zeros(len(rows), width, dtype=torch.float32)
        for index, row in enumerate(rows):
            values = captured[int(row)]
            log_probs[index, : values.numel()] = values
        return DataProto.from_dict(tensors={LOG_PROBS: log_probs})

    @register(ENGINE_DISPATCH)
    def tinker_forward(self, data: DataProto) -> DataProto:
        """The target log-probs ``(B, R)`` of this rank's rows, no gradient."""
        log_probs, _ = self.engine.compute_log_prob(data, 1.0)
        return DataProto.from_dict(tensors={LOG_PROBS: log_probs.float()})

    @register(Dispatch.ONE_TO_ALL)
    def tinker_reset_optimizer(self) -> None:
        """Forget the optimizer's state (a weights-only ``load_state``)."""
        self.engine.reset_optimizer()

    @register(Dispatch.ONE_TO_ALL)
    def tinker_optim_step(self, hyper: OptimHyper) -> dict[str, float]:
        """Apply the accumulated gradients with ``hyper``; ``grad_norm`` and ``lr``."""
        return self.engine.optim_step(hyper)
