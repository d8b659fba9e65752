"""The Megatron-core training engine: a ``GPTModel`` split by tensor / pipeline parallelism.

Data parallelism replicates the (TP/PP sharded) model; gradients are summed over replicas
before the step. The optimizer state is replicated too, or split over the replicas with
``megatron.use_distributed_optimizer`` (:mod:`~hf_engines.megatron.zero`).
All ranks of one tensor / pipeline group must be handed the same batch; each data-parallel
replica gets its own shard. The process group must be initialised by the caller.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from os import PathLike
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from hf_controller import ConfigurationError
from hf_engines.checkpointing import (
    DEFAULT_MAX_SHARD_SIZE,
    hf_export,
    move_optimizer_state,
    save_model_metadata,
)
from hf_engines.config import EngineConfig
from hf_engines.engine import LossFn, ModelOutputs
from hf_engines.logprob import response_log_probs
from hf_engines.megatron import checkpoint
from hf_engines.megatron.convert import hf_to_mcore
from hf_engines.megatron.cpu_compat import seed_model_parallel_rng
from hf_engines.megatron.grads import clip_gradients, reduce_gradients
from hf_engines.megatron.model import build_gpt_model, head_dim
from hf_engines.megatron.moe import align_micro_batches, pad_rows
from hf_engines.megatron.parallel import initialize_parallel, pipeline_rank_of_stage
from hf_engines.megatron.pipeline import StageInput, prepare, run_schedule
from hf_engines.megatron.routing import pad_routing
from hf_engines.megatron.shard_load import load_shards, shard_source
from hf_engines.megatron.weights import iter_full_tensors, load_full_weights
from hf_engines.megatron.zero import DistributedOptimizer
from hf_engines.micro_batch import (
    add_metrics,
    batch_tensors,
    global_step_metrics,
    response_counts,
    split_micro_batches,
    with_totals,
)
from hf_engines.models import build_hf_model, build_meta_hf_model
from hf_engines.optim import OptimHyper, build_optimizer, hyper_params
from hf_engines.schedule import build_lr_scheduler
from hf_protocol import DataProto, fields
from hf_protocol.routing import ROUTED_EXPERTS


class MegatronEngine:
    """A :class:`~hf_engines.engine.TrainingEngine` over megatron-core (TP / PP / EP / DP).

    Build it on every rank with the same ``config`` (``backend='megatron'``). Weights come
    from the Hugging Face model named by ``config.model`` and are converted to megatron's
    layout on the fly. From a directory of safetensors files each rank reads only its own
    slices (:mod:`~hf_engines.megatron.shard_load`); a model without them (random weights
    from ``hf_config``, ``*.bin`` files, a new value head) is built whole on every rank.
    """

    def __init__(self, config: EngineConfig) -> None:
        if config.backend != "megatron":
            raise ConfigurationError(
                f"MegatronEngine got backend={config.backend!r}; set backend='megatron'"
            )
        self.config = config
        self.device = initialize_parallel(config.megatron)
        seed_model_parallel_rng(config.model.seed)
        hf_model = build_meta_hf_model(config.model)
        self.hf_config = hf_model.config
        self._hf_class = type(hf_model)
        self._hf_names = list(hf_model.state_dict())
        self._value = config.model.head == "value"
        self._groups = self.hf_config.num_key_value_heads or self.hf_config.num_attention_heads
        self._layers = self.hf_config.num_hidden_layers
        tied = bool(getattr(self.hf_config, "tie_word_embeddings", False))
        source = shard_source(config.model, self._hf_names, tied)
        if source is None:  # no safetensors holding every tensor: build the whole model
            hf_model = build_hf_model(config.model)
        full = hf_to_mcore(hf_model.state_dict(), self._layers, self._groups, self._value)
        self._shapes = {name: (tuple(t.shape), t.dtype) for name, t in full.items()}
        self.model = build_gpt_model(self.hf_config, config.model, config.megatron, self.device)
        if source is None:
            load_full_weights(self.model, full)
        else:
            load_shards(self.model, source, self._groups, self._value)
        del hf_model, full
        optim = config.optim
        # optim.name='muon' (tensor_model_parallel_size=1 only, checked by EngineConfig):
        # Muon on the layers' 2-D matrices, AdamW on the rest (hf_engines.optim).
        self._zero = (
            DistributedOptimizer(self.model) if config.megatron.use_distributed_optimizer else None
        )
        self.optimizer = build_optimizer(
            self.model,
            optim,
            self.model.decoder.layers,
            params=None if self._zero is None else self._zero.params,
        )
        self.scheduler = build_lr_scheduler(
            self.optimizer,
            optim.warmup_steps,
            optim.schedule,
            optim.total_steps,
            optim.min_lr_ratio,
        )
        self._global_step = 0

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return self._global_step

    # ------------------------------------------------------------------ forward

    def _head(self, output: torch.Tensor, item: StageInput, temperature: float) -> ModelOutputs:
        """Per-token outputs of the last stage at the response positions (``output`` is
        ``(b, R, V)``: the model computes only those, see :func:`.pipeline.outputs_at`)."""
        if self._value:
            return {"values": output[..., 0].float()}
        log_probs, entropy = response_log_probs(output, item.responses, temperature)
        return {"log_probs": log_probs, "entropy": entropy}

    def _inputs(self, batch: DataProto) -> tuple[list[StageInput], int]:
        """The prepared micro-batches and how many are real; with expert parallelism they
        are padded and filled up to the expert-parallel group's (see :mod:`.moe`)."""
        if len(batch) == 0:
            raise ValueError("got an empty batch; every data-parallel rank needs at least one row")
        inputs = [
            prepare(micro, self.device)
            for micro in split_micro_batches(batch, self.config.micro_batch)
        ]
        return align_micro_batches(
            inputs,
            lambda item: (item.input_ids.shape[0], item.input_ids.shape[1]),
            _pad_input,
            lambda item: prepare(_filler(item.micro_batch), self.device),
            self.device,
        )

    @torch.no_grad()
    def _forward_only(
        self, batch: DataProto, temperature: float, keys: tuple[str, ...]
    ) -> list[torch.Tensor]:
        """``keys`` outputs for the whole batch, ``(B, R)`` each, on every pipeline stage."""
        self.model.eval()
        collected: list[ModelOutputs] = []

        def keep(output: torch.Tensor, item: StageInput) -> None:
            collected.append(self._head(output, item, temperature))

        inputs, real = self._inputs(batch)
        try:
            run_schedule(self.model, inputs, keep, self.hf_config.hidden_size, False)
        finally:
            self.model.train()
        collected = collected[:real]  # drop the fillers' outputs
        shape = tuple(batch_tensors(batch)[fields.RESPONSES].shape)
        results = []
        for key in keys:
            if collected:
                result = torch.cat([out[key] for out in collected])  # type: ignore[literal-required]
            else:
                result = torch.empty(shape, dtype=torch.float32, device=self.device)
            if parallel_state.get_pipeline_model_parallel_world_size() > 1:
                dist.broadcast(
                    result,
                    src=pipeline_rank_of_stage(
                        parallel_state.get_pipeline_model_parallel_world_size() - 1
                    ),
                    group=parallel_state.get_pipeline_model_parallel_group(),
                )
            results.append(result.cpu())
        return results

    def compute_log_prob(
        self, batch: DataProto, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy of ``batch["responses"]``; each ``(B, R)`` float32 on CPU."""
        if self._value:
            raise ValueError("compute_log_prob needs model.head='causal_lm'")
        log_probs, entropy = self._forward_only(batch, temperature, ("log_probs", "entropy"))
        return log_probs, entropy

    def compute_values(self, batch: DataProto) -> torch.Tensor:
        """Value-head outputs at the response positions; ``(B, R)`` float32 on CPU."""
        if not self._value:
            raise ValueError("compute_values needs model.head='value' (a critic engine)")
        return self._forward_only(batch, 1.0, ("values",))[0]

    # ------------------------------------------------------------------ training

    def train_step(self, mini_batch: DataProto, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step over this replica's ``mini_batch``; see :class:`TrainingEngine`.

        :meth:`forward_backward` then :meth:`optim_step` with the configured optimizer.
        """
        result = self.forward_backward(mini_batch, loss_fn)
        result.update(self.optim_step())
        return result

    def forward_backward(self, mini_batch: DataProto, loss_fn: LossFn) -> dict[str, float]:
        """Add this replica's ``mini_batch`` gradients to the local ones; no step.

        Every micro-batch gets the mini-batch's token and sequence totals over all
        data-parallel replicas (:data:`~hf_engines.engine.LossFn`) and returns its share of
        the mini-batch loss; gradients are summed over replicas in :meth:`optim_step`, once
        for everything accumulated since the last step (the sum is linear, so reducing
        each call's gradients apart would give the same step with more collectives).
        """
        temperature = float(mini_batch.meta_info.get(fields.TEMPERATURE, 1.0))
        inputs, _ = self._inputs(mini_batch)  # fillers have no response tokens
        counts = response_counts([item.micro_batch for item in inputs])
        tokens, sequences = self._data_parallel_sums(*counts)
        if tokens == 0:
            raise ValueError("the mini-batch has no response tokens (response_mask is all zero)")
        for item in inputs:
            item.micro_batch = with_totals(item.micro_batch, tokens, sequences)
        sums: dict[str, float] = {}
        local = {"loss": 0.0, "with_tokens": 0}

        def loss_head(output: torch.Tensor, item: StageInput) -> torch.Tensor:
            share, metrics = loss_fn(self._head(output, item, temperature), item.micro_batch)
            local["loss"] += float(share.detach())
            counted = response_counts([item.micro_batch])[0] > 0  # a filler reports nothing
            local["with_tokens"] += int(counted)
            add_metrics(sums, metrics, counted)
            return share

        run_schedule(self.model, inputs, loss_head, self.hf_config.hidden_size, True)
        result = global_step_metrics(
            local["loss"],
            sums,
            int(local["with_tokens"]),
            self.device,
            parallel_state.get_data_parallel_group(),
        )
        return _from_last_stage(result)

    def optim_step(self, hyper: OptimHyper | None = None) -> dict[str, float]:
        """Reduce the accumulated gradients, step and zero them; see :class:`TrainingEngine`.

        ``hyper``: this step's AdamW values and clipping instead of ``optim.*`` and the LR
        schedule (which still counts the step).
        """
        reduce_gradients(self.model)
        max_norm = self.config.optim.grad_clip if hyper is None else hyper.max_grad_norm
        grad_norm = clip_gradients(self.model, max_norm)
        # A non-finite norm is the same on every rank: skip the update, keep ranks aligned.
        with hyper_params(self.optimizer, hyper):
            if math.isfinite(grad_norm):
                if self._zero is None:
                    self.optimizer.step()
                else:  # distributed optimizer: each rank steps its share, then they exchange
                    self._zero.step(self.optimizer)
        lr = float(self.scheduler.get_last_lr()[0]) if hyper is None else hyper.learning_rate
        self.scheduler.step()
        self.model.zero_grad(set_to_none=True)
        self._global_step += 1
        return {"grad_norm": grad_norm, "lr": lr}

    def _data_parallel_sums(self, *values: float) -> list[float]:
        """Sums of ``values`` over the data-parallel replicas (one all-reduce)."""
        total = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(total, group=parallel_state.get_data_parallel_group())
        return [float(v) for v in total.tolist()]

    # ------------------------------------------------------------------ state

    def save_checkpoint(self, directory: str | PathLike[str]) -> None:
        """Save model, optimizer, scheduler, step and RNG state, one file per rank."""
        checkpoint.save(
            Path(directory),
            self.model,
            self.optimizer,
            self.scheduler,
            self._global_step,
            self.config.megatron,
        )
        if dist.get_rank() == 0:
            save_model_metadata(Path(directory), self.config, self.hf_config)

    def load_checkpoint(self, directory: str | PathLike[str]) -> None:
        """Restore a checkpoint saved with the same world size and parallel layout."""
        self._global_step = checkpoint.load(
            Path(directory), self.model, self.optimizer, self.scheduler, self.config.megatron
        )

    def iter_full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, full tensor)`` one at a time, names as in the HF ``state_dict()``.

        Collective over the model-parallel group: every rank must consume the whole
        iterator. Tensors are gathered (over tensor-parallel ranks, then broadcast along the
        pipeline) one at a time and converted one decoder layer at a time, so a rank holds
        at most about one layer of full tensors beyond its own shards (plus the embedding
        when ``lm_head`` is tied to it), never the whole model.
        """
        tied_head = "output_layer.weight" not in self._shapes and not self._value
        return checkpoint.iter_hf_params(
            iter_full_tensors(self.model, self._shapes, self._layers),
            self._hf_names,
            self._groups,
            head_dim(self.hf_config),
            self._value,
            tied_head,
        )

    def export_hf(
        self,
        directory: str | PathLike[str],
        dtype: str | torch.dtype | None = None,
        max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
    ) -> None:
        """Write a Hugging Face directory that ``from_pretrained`` loads (collective).

        ``save_pretrained``: safetensors shards of at most ``max_shard_size``, weights in
        ``dtype`` (default: ``model.dtype``, the dtype trained in), the source model's
        tokenizer alongside. Gathered one layer at a time and written on global rank 0.
        """
        checkpoint.export_hf(
            Path(directory),
            self.iter_full_params(),
            self.hf_config,
            hf_export(self.config.model, self._hf_class, dtype, max_shard_size),
        )

    def reset_optimizer(self) -> None:
        """Forget the optimizer's state; see :class:`~hf_engines.engine.TrainingEngine`."""
        self.optimizer.state.clear()

    def offload(self) -> None:
        """Move parameters and optimizer state to CPU memory (nothing to do on a CPU run)."""
        if self.device.type == "cpu":
            return
        self.model.to("cpu")
        move_optimizer_state(self.optimizer, torch.device("cpu"))
        torch.cuda.empty_cache()

    def onload(self) -> None:
        """Bring parameters and optimizer state back to the compute device."""
        if self.device.type == "cpu":
            return
        self.model.to(self.device)
        move_optimizer_state(self.optimizer, self.device)


def _pad_input(item: StageInput, rows: int, length: int) -> StageInput:
    """``item`` padded to ``(rows, length)``: zero tokens, no recorded routing (-1)."""
    routed = item.routed_experts
    return replace(
        item,
        input_ids=pad_rows(item.input_ids, rows, length),
        routed_experts=None if routed is None else pad_routing(routed, rows, length),
    )


def _filler(micro_batch: DataProto) -> DataProto:
    """The first row of ``micro_batch`` with ``response_mask`` zeroed: no loss, no gradient
    (and, under router replay, no recorded routing: its routers choose for themselves)."""
    rows = micro_batch.slice(0, 1)
    tensors = batch_tensors(rows).clone()
    tensors[fields.RESPONSE_MASK] = torch.zeros_like(tensors[fields.RESPONSE_MASK])
    if ROUTED_EXPERTS in tensors.keys():  # noqa: SIM118 (a TensorDict)
        tensors[ROUTED_EXPERTS] = torch.full_like(tensors[ROUTED_EXPERTS], -1)
    return DataProto(
        batch=tensors, non_tensor_batch=dict(rows.non_tensor_batch), meta_info=rows.meta_info
    )


def _from_last_stage(values: dict[str, float]) -> dict[str, float]:
    """The last pipeline stage's ``values`` (where the loss is computed), on every stage."""
    size = parallel_state.get_pipeline_model_parallel_world_size()
    if size == 1:
        return values
    box: list[object] = [values]
    dist.broadcast_object_list(
        box,
        src=pipeline_rank_of_stage(size - 1),
        group=parallel_state.get_pipeline_model_parallel_group(),
    )
    received = box[0]
    assert isinstance(received, dict)
    return received
