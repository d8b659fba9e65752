"""A served model: one Tinker training client as worker groups, and its samplers.

A training client is an actor group (:class:`~hf_algos.serve.worker.TinkerActorWorker`,
FSDP or Megatron as ``actor.engine`` says) and a rollout group, placed like a trainer's
(``trainer.placement``): ``hybrid`` fuses them in one process per slot, ``separate`` gives
the rollout its own and streams weights over the weight channel. Saving weights for a
sampler is a weight push (:meth:`RoleGroups.sync_weights`): the weights never pass through
the server. Every call runs on the model's :class:`~hf_algos.serve.runner.OrderedRunner`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hf_algos.config.actor import ActorSection
from hf_algos.serve.batch import LOSS_CONFIG, LOSS_FN, check_call, per_datum, to_batch
from hf_algos.serve.config import ServeConfig
from hf_algos.serve.errors import BadRequestError
from hf_algos.serve.losses import tinker_loss
from hf_algos.serve.runner import OrderedRunner
from hf_algos.serve.wire import Datum, ForwardBackwardCall, SampledSequence
from hf_algos.serve.worker import LOG_PROBS, TinkerActorWorker
from hf_algos.trainers.roles.groups import RoleGroups, build_role_groups
from hf_algos.trainers.roles.workers import actor_class_with_loss, rollout_class
from hf_controller import RayClassWithInitArgs
from hf_engines import OptimHyper
from hf_protocol import DataProto, fields, left_pad
from hf_rollout import SamplingConfig

STATE_INFO = "tinker.json"
"""The file beside a saved state that says its base model and LoRA rank."""


def saved_lora_rank(directory: Path) -> int:
    """The LoRA rank of the client that saved the state in ``directory`` (0: full)."""
    info = directory / STATE_INFO
    if not info.is_file():
        raise BadRequestError(f"no saved state at {str(directory)!r} (no {STATE_INFO})")
    return int(json.loads(info.read_text())["lora_rank"])


@dataclass(frozen=True)
class SampleCall:
    """One ``asample`` request, decoded."""

    prompt: list[int]
    num_samples: int
    sampling: SamplingConfig
    prompt_logprobs: bool = False


def loss_sums(loss_fn: str, data: list[Datum], log_probs: list[np.ndarray], config: dict) -> float:
    """The call's summed loss, from each datum's target log-probs and its inputs."""
    total = 0.0
    for datum, values in zip(data, log_probs, strict=True):
        inputs = {
            name: torch.from_numpy(np.asarray(array, dtype=np.float64))
            for name, array in datum.inputs.items()
            if name != "target_tokens"
        }
        target = torch.from_numpy(values.astype(np.float64))
        mask = torch.ones_like(target)
        total += float(tinker_loss(loss_fn, target, inputs, config, mask))
    return total


class ServedModel:
    """One training client's worker groups, its weight versions and its call queue."""

    def __init__(self, model_id: str, config: ServeConfig, tokenizer: Any, lora_rank: int) -> None:
        self.model_id = model_id
        self.config = config
        self.tokenizer = tokenizer
        self.lora_rank = lora_rank
        self.pad_id = int(tokenizer.pad_token_id)
        self.runner = OrderedRunner(model_id)
        self.version = 0
        """The weights' version in the rollout (one more per sampler save)."""
        self.stale = False
        """True once an optimizer step changed the actor after the last push."""
        self.samplers: dict[str, int] = {}
        """Sampling session id -> the weight version it samples from."""
        self.groups: RoleGroups | None = None

    def actor_section(self) -> ActorSection:
        """The config's actor with this client's LoRA rank (0: full fine-tuning)."""
        actor = self.config.actor
        return dataclasses.replace(actor, lora=dataclasses.replace(actor.lora, rank=self.lora_rank))

    def build(self) -> None:
        """Start the worker groups and load the model (minutes for a real model)."""
        actor, trainer = self.actor_section(), self.config.trainer
        base = actor_class_with_loss(actor, trainer, loss_fn=None)  # type: ignore[arg-type]
        actor_cls = RayClassWithInitArgs(TinkerActorWorker, *base.args, **base.kwargs)
        rollout_cls = rollout_class(self.config.rollout, actor, trainer, self.tokenizer)
        self.groups = build_role_groups(trainer, {"actor": actor_cls}, rollout_cls)
        self.groups.init_models()

    @property
    def actor(self) -> Any:
        """The actor group (its Tinker methods)."""
        assert self.groups is not None, "build() first"
        return self.groups.actor

    def forward_backward(
        self, call: ForwardBackwardCall
    ) -> tuple[list[np.ndarray], dict[str, float]]:
        """Per-datum target log-probs and ``loss:sum`` (gradients accumulated unless
        ``forward_only``)."""
        check_call(call.loss_fn, call.data, call.config)
        meta = {LOSS_FN: call.loss_fn, LOSS_CONFIG: dict(call.config), fields.TEMPERATURE: 1.0}
        batch = to_batch(call.data, self.pad_id, meta)
        method = (
            self.actor.tinker_forward if call.forward_only else self.actor.tinker_forward_backward
        )
        output = method(batch)
        log_probs = per_datum(output.batch[LOG_PROBS], call.data)
        loss = loss_sums(call.loss_fn, call.data, log_probs, call.config)
        if not math.isfinite(loss):
            raise BadRequestError(f"the loss is {loss}: check the inputs (logprobs, advantages)")
        return log_probs, {"loss:sum": loss}

    def optim_step(self, hyper: OptimHyper) -> dict[str, float]:
        """Apply the accumulated gradients; ``grad_norm`` and ``lr`` (as ``name:mean``)."""
        result = self.actor.tinker_optim_step(hyper)[0]
        self.stale = True
        return {f"optim/{key}:mean": float(value) for key, value in result.items()}

    def save_for_sampler(self, sampler_id: str) -> int:
        """Push the actor's weights to the rollout as a new version for ``sampler_id``."""
        assert self.groups is not None
        self.version += 1
        self.groups.sync_weights(self.version)
        self.stale = False
        self.samplers[sampler_id] = self.version
        return self.version

    def save_state(self, directory: Path) -> None:
        """Save weights and optimizer state (an engine checkpoint) to ``directory``, with
        ``tinker.json`` (base model, LoRA rank) for a client created from it later."""
        directory.parent.mkdir(parents=True, exist_ok=True)
        self.actor.save_checkpoint(str(directory))
        about = {"base_model": self.config.base_model, "lora_rank": self.lora_rank}
        (directory / STATE_INFO).write_text(json.dumps(about))

    def load_state(self, directory: Path, optimizer: bool) -> None:
        """Restore :meth:`save_state`'s ``directory``: the weights, and the optimizer's
        state with ``optimizer`` (else a fresh optimizer)."""
        if not directory.is_dir():
            raise BadRequestError(f"no saved state at {str(directory)!r}")
        self.actor.load_checkpoint(str(directory))
        if not optimizer:
            self.actor.tinker_reset_optimizer()
        self.stale = True

    def sample(self, calls: Sequence[SampleCall]) -> list[list[SampledSequence]]:
        """Sequences for ``calls`` that share one sampling config, generated together."""
        assert self.groups is not None
        sampling = dataclasses.replace(calls[0].sampling, n=1)
        prompts = [call.prompt for call in calls for _ in range(call.num_samples)]
        tensors = left_pad(prompts, self.pad_id)
        batch = DataProto.from_dict(
            tensors={
                fields.INPUT_IDS: tensors.input_ids,
                fields.ATTENTION_MASK: tensors.attention_mask,
                fields.POSITION_IDS: tensors.position_ids,
            },
            meta_info={fields.SAMPLING: sampling},
        )
        output = self.groups.rollout.generate_sequences(batch)
        sequences = _sequences(output, sampling)
        grouped: list[list[SampledSequence]] = []
        start = 0
        for call in calls:
            grouped.append(sequences[start : start + call.num_samples])
            start += call.num_samples
        return grouped

    def prompt_logprobs(self, sampler_id: str, prompt: list[int]) -> list[float]:
        """Each prompt token's log-prob given the ones before (NaN for the first), under
        the weights of ``sampler_id`` (computed by the actor while it still holds them)."""
        if self.stale or self.samplers.get(sampler_id) != self.version:
            raise BadRequestError(
                f"prompt log-probs of sampler {sampler_id!r} need its weights, which the "
                "training client has moved past; save weights for a new sampler and use it"
            )
        if len(prompt) < 2:
            return [math.nan] * len(prompt)
        datum = Datum(
            tokens=np.asarray(prompt[:-1], dtype=np.int64),
            inputs={
                "target_tokens": np.asarray(prompt[1:], dtype=np.int64),
                "weights": np.ones(len(prompt) - 1, dtype=np.float32),
            },
        )
        call = ForwardBackwardCall(self.model_id, 0, "cross_entropy", [datum], forward_only=True)
        batch = to_batch(call.data, self.pad_id, {LOSS_FN: "cross_entropy"})
        output = self.actor.tinker_forward(batch)
        values = per_datum(output.batch[LOG_PROBS], call.data)[0]
        return [math.nan, *map(float, values)]

    def close(self) -> None:
        """Stop the call queue and the worker groups."""
        self.runner.close()
        if self.groups is not None:
            self.groups.shutdown()


def _sequences(output: DataProto, sampling: SamplingConfig) -> list[SampledSequence]:
    """The rollout output's rows as sampled sequences (tokens where ``response_mask`` is 1)."""
    assert output.batch is not None
    responses = output.batch[fields.RESPONSES]
    mask = output.batch[fields.RESPONSE_MASK].bool()
    log_probs = output.batch[fields.ROLLOUT_LOG_PROBS]
    sequences = []
    for row in range(responses.shape[0]):
        tokens = responses[row][mask[row]].tolist()
        values = log_probs[row][mask[row]].float().tolist()
        stopped = len(tokens) < sampling.max_new_tokens or (
            bool(tokens) and tokens[-1] in set(sampling.stop_token_ids)
        )
        sequences.append(SampledSequence(tokens=tokens, logprobs=values, stopped=stopped))
    return sequences
