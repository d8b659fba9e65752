"""``ActorWorker``: the policy's log-probs and its PPO-style updates."""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_controller import register, release_host_memory
from hf_engines.config import LoRAConfig, check_lora_backend
from hf_engines.engine import LossFn
from hf_engines.fsdp import FSDPEngine
from hf_engines.workers.base import (
    ENGINE_DISPATCH,
    TrainableEngineWorker,
    check_head,
    metrics_proto,
)
from hf_engines.workers.updates import UpdateConfig, run_update
from hf_protocol import DataProto, fields


@dataclass(frozen=True)
class ActorConfig(UpdateConfig):
    """The actor: a causal-LM engine and how a batch is cut into optimizer steps."""

    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters (``rank=0``: every weight trains)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_head("ActorWorker", self.engine, "causal_lm")
        check_lora_backend(self.lora, self.engine, "ActorWorker")


def require_loss_fn(role: str, loss_fn: LossFn | None) -> LossFn:
    """``loss_fn``, or an error naming the fix when the worker was built without one."""
    if loss_fn is None:
        raise ValueError(
            f"{role} was built without a loss_fn, so it cannot update; pass "
            "loss_fn=functools.partial(<module-level loss>, ...) when creating the worker"
        )
    return loss_fn


class ActorWorker(TrainableEngineWorker):
    """The policy model as one rank of an SPMD group (FSDP2 or Megatron engine).

    ``loss_fn(outputs, micro_batch) -> (loss, metrics)`` is a pure function (build it with
    ``functools.partial`` over a module-level function so it pickles through Ray).
    """

    def __init__(self, config: ActorConfig, loss_fn: LossFn | None = None) -> None:
        super().__init__(config.engine)
        self.config = config
        self.loss_fn = loss_fn
        self._lora = config.lora

    @register(ENGINE_DISPATCH)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` ``(B, R)`` of the responses, at
        ``meta_info["temperature"]`` (default 1.0)."""
        temperature = float(data.meta_info.get(fields.TEMPERATURE, 1.0))
        log_probs, entropy = self.engine.compute_log_prob(data, temperature)
        return DataProto.from_dict(
            tensors={fields.OLD_LOG_PROBS: log_probs, fields.ENTROPYS: entropy}
        )

    @register(ENGINE_DISPATCH)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` ``(B, R)``: the base model's, LoRA adapters off (the reference
        policy of a LoRA run, so it needs no reference worker of its own)."""
        if not isinstance(self.engine, FSDPEngine) or self.engine.lora is None:
            raise ValueError(
                "ActorWorker.compute_ref_log_prob serves as the reference only with LoRA "
                "(actor.lora.rank > 0); without it build a ReferenceWorker"
            )
        temperature = float(data.meta_info.get(fields.TEMPERATURE, 1.0))
        log_probs, _ = self.engine.compute_base_log_prob(data, temperature)
        return DataProto.from_dict(tensors={fields.REF_LOG_PROB: log_probs})

    @register(ENGINE_DISPATCH)
    def update_actor(self, data: DataProto) -> DataProto:
        """``ppo_epochs`` passes of mini-batch steps; metrics ``actor/<name>`` as lists."""
        loss_fn = require_loss_fn("ActorWorker", self.loss_fn)
        group = self.data_parallel.group
        metrics = run_update(self.engine, data, self.config, loss_fn, "actor", group)
        release_host_memory()  # the step's activations and logits, freed but still held
        return metrics_proto(metrics)
