"""The FSDP2 training engine: a transformers model sharded with ``fully_shard``.

The same code runs on CPU with gloo and on CUDA with NCCL; the process group must be
initialised by the caller (a worker does it from the controller's environment).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from os import PathLike
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from hf_controller import release_host_memory
from hf_engines.checkpointing import (
    DEFAULT_MAX_SHARD_SIZE,
    hf_export,
    move_optimizer_state,
    save_model_metadata,
)
from hf_engines.config import EngineConfig, LoRAConfig, check_lora_backend
from hf_engines.engine import LossFn, ModelOutputs
from hf_engines.fsdp import checkpoint
from hf_engines.fsdp.forward import forward_micro_batch
from hf_engines.fsdp.sharding import (
    build_mesh,
    defer_gradient_sync,
    resolve_device,
    shard_model,
    syncs_at_last_micro_batch,
)
from hf_engines.fsdp.sp_forward import forward_sequence_parallel, zero_loss
from hf_engines.fsdp.ulysses import enable_ulysses, sequence_parallel_group
from hf_engines.fsdp.unpad import PaddingMode, choose_padding_mode
from hf_engines.micro_batch import (
    add_metrics,
    batch_tensors,
    global_step_metrics,
    response_counts,
    split_micro_batches,
    with_totals,
)
from hf_engines.models import build_hf_model, transformer_blocks
from hf_engines.optim import OptimHyper, build_optimizer, hyper_params
from hf_engines.output_head import token_scorer
from hf_engines.precision import with_compute_dtype
from hf_engines.schedule import build_lr_scheduler
from hf_protocol import DataProto, fields
from hf_protocol.routing import ROUTED_EXPERTS, replay_routing

logger = logging.getLogger(__name__)

_MODEL_INPUTS = (fields.INPUT_IDS, fields.ATTENTION_MASK, fields.POSITION_IDS, fields.RESPONSES)


class FSDPEngine:
    """A :class:`~hf_engines.engine.TrainingEngine` over FSDP2.

    Every rank of the default process group holds one shard of the model and of the
    optimizer state (AdamW, or Muon with AdamW: ``optim.name``). Build it on every rank
    with the same ``config``. With ``fsdp.ulysses_sequence_parallel_size`` > 1 each group of
    that many ranks runs each member's micro-batches in turn, their packed tokens split
    between them (:mod:`hf_engines.fsdp.sp_forward`); every rank still gets and returns its
    own rows. With ``lora`` enabled the base weights are frozen and only
    the adapters train (see :mod:`hf_engines.lora`).
    """

    def __init__(self, config: EngineConfig, lora: LoRAConfig | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "FSDPEngine needs torch.distributed to be initialised first; call "
                "torch.distributed.init_process_group('gloo') on CPU or ('nccl') on CUDA "
                "(a worker group sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for it)"
            )
        self.device = resolve_device(config.fsdp)
        # fsdp.param_dtype='auto' given to the engine itself (a driver resolves it first)
        config, choice = with_compute_dtype(config, self.device.type)
        if choice is not None and dist.get_rank() == 0:
            logger.info(choice.line("fsdp.param_dtype"))
        self.config = config
        self.mesh = build_mesh(config.fsdp, self.device.type)
        self.sp_group = sequence_parallel_group(
            config.fsdp.ulysses_sequence_parallel_size, self.device.type
        )
        """This rank's Ulysses group (``fsdp.ulysses_sequence_parallel_size``), or ``None``."""
        model = build_hf_model(config.model)
        self._model_class = type(model)  # before fully_shard renames the class
        # Checked on the plain model (two tokens), before Ulysses or LoRA change its forward.
        scorer = (
            token_scorer(model, config.logprob_chunk_size)
            if config.model.head == "causal_lm"
            else None
        )
        if self.sp_group is not None:
            enable_ulysses(model, config)
        self.lora = lora if lora is not None and lora.enabled else None
        """The adapters' config, or ``None`` when every weight trains."""
        self._peft: Any = None
        if self.lora is not None:
            check_lora_backend(self.lora, config, "FSDPEngine")
            # Imported only with LoRA on: peft is the optional ``lora`` extra.
            from hf_engines.lora import apply_lora

            # Adapters before fully_shard, so FSDP2 shards them with their blocks; their
            # random init is seeded so every rank (and every world size) draws the same.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.model.seed)
                self._peft = apply_lora(model, self.lora)
        self.scorer = scorer if scorer is not None and scorer.fits(model) else None
        """Scores tokens a chunk at a time (``logprob_chunk_size``); ``None``: full logits."""
        blocks = transformer_blocks(model)  # before fully_shard renames their classes
        shard_model(model, self.mesh, config.fsdp)
        self.model = model
        self._sync_at_last = syncs_at_last_micro_batch(config.fsdp, dist.get_world_size())
        """Reduce gradients once per step, after the last micro-batch (``fsdp.gradient_sync``)."""
        # With LoRA only the adapters: the frozen base gets neither gradients nor optimizer
        # state.
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        """The parameters the optimizer steps."""
        optim = config.optim
        # foreach=True: torch picks it only for CUDA parameters; on the CPU the default
        # per-tensor loop pays one DTensor dispatch per op and parameter (the step of the
        # quickstart's 0.5M-parameter model: 3.0 -> 1.7 ms), and the result is bit-identical.
        # optim.fused: one fused kernel over all parameters instead. optim.name='muon': Muon
        # on the blocks' 2-D matrices (whole, see hf_engines.optim), AdamW on the rest.
        self.optimizer = build_optimizer(model, optim, blocks, foreach=True)
        self.scheduler = build_lr_scheduler(
            self.optimizer,
            optim.warmup_steps,
            optim.schedule,
            optim.total_steps,
            optim.min_lr_ratio,
        )
        self._global_step = 0
        self.padding_mode: PaddingMode = choose_padding_mode(
            config.model.attn_implementation, config.model.remove_padding
        )
        """How padding is skipped: ``pack``, ``trim`` or ``off`` (see ``fsdp.unpad``)."""

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return self._global_step

    # ------------------------------------------------------------------ forward

    def _forward(
        self, micro_batch: DataProto, temperature: float, contribute: bool = True
    ) -> ModelOutputs:
        """Run the model on one micro-batch; outputs at the response positions only.

        Under sequence parallelism the whole SP group runs it; ``contribute=False``: this
        rank's rows sit out (see :meth:`_passes`).
        """
        tensors = batch_tensors(micro_batch)
        missing = [key for key in _MODEL_INPUTS if key not in tensors]
        if missing:
            raise KeyError(f"batch lacks {missing}; an engine needs the fields {_MODEL_INPUTS}")
        inputs = {key: tensors[key].to(self.device) for key in _MODEL_INPUTS}
        responses = inputs.pop(fields.RESPONSES)
        value_head = self.config.model.head == "value"
        if self.sp_group is not None:
            return forward_sequence_parallel(
                self.model,
                inputs,
                responses,
                value_head,
                temperature,
                self.sp_group,
                contribute,
                self.scorer,
            )
        if ROUTED_EXPERTS in tensors:
            # Router replay (R3): route every token to the experts the rollout recorded,
            # on the rows as recorded (the padded forward; see hf_protocol.routing).
            with replay_routing(self.model, tensors[ROUTED_EXPERTS]):
                return forward_micro_batch(
                    self.model, inputs, responses, value_head, temperature, "off", self.scorer
                )
        return forward_micro_batch(
            self.model, inputs, responses, value_head, temperature, self.padding_mode, self.scorer
        )

    def _passes(
        self, micro_batch: DataProto, temperature: float
    ) -> Iterator[tuple[ModelOutputs, bool]]:
        """Forward passes for one micro-batch: ``(outputs, mine)``.

        Without sequence parallelism one pass, this rank's. With it one pass per rank of
        the SP group, in rank order: each rank's micro-batch in turn, split over the whole
        group, so a rank holds ``1/sp`` of one micro-batch's activations at a time. In the
        others' passes (``mine=False``) this rank's outputs are zeros that only keep the
        group's collectives in step.
        """
        if self.sp_group is None:
            yield self._forward(micro_batch, temperature), True
            return
        me = dist.get_rank(self.sp_group)
        for owner in range(dist.get_world_size(self.sp_group)):
            yield self._forward(micro_batch, temperature, owner == me), owner == me

    def _aligned_micro_batches(self, batch: DataProto) -> list[tuple[DataProto, bool]]:
        """Micro-batches of this rank, padded with repeats to the largest count over ranks.

        FSDP2 gathers parameters collectively in every forward, so all ranks must run the
        same number of them; the repeats (flag ``False``) are computed and then ignored.
        """
        if len(batch) == 0:
            raise ValueError("got an empty batch; every rank needs at least one row")
        micro_batches = split_micro_batches(batch, self.config.micro_batch)
        # On the compute device: an NCCL group has no backend for CPU tensors.
        count = torch.tensor([len(micro_batches)], dtype=torch.int64, device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        padding = [(micro_batches[0], False)] * (int(count.item()) - len(micro_batches))
        return [(micro, True) for micro in micro_batches] + padding

    @torch.no_grad()
    def _forward_only(self, batch: DataProto, temperature: float) -> list[ModelOutputs]:
        """Outputs of every real micro-batch of ``batch``, in order, without gradients."""
        self.model.eval()
        outputs: list[ModelOutputs] = []
        try:
            for micro, real in self._aligned_micro_batches(batch):
                for out, mine in self._passes(micro, temperature):
                    if real and mine:
                        outputs.append(out)
        finally:
            self.model.train()
        return outputs

    def compute_log_prob(
        self, batch: DataProto, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy of ``batch["responses"]``; each ``(B, R)`` float32 on CPU."""
        if self.config.model.head != "causal_lm":
            raise ValueError("compute_log_prob needs model.head='causal_lm'")
        outputs = self._forward_only(batch, temperature)
        log_probs = torch.cat([out["log_probs"] for out in outputs]).cpu()
        entropy = torch.cat([out["entropy"] for out in outputs]).cpu()
        return log_probs, entropy

    def compute_base_log_prob(
        self, batch: DataProto, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`compute_log_prob` of the base model, the LoRA adapters switched off: the
        reference policy of a LoRA run, without a second copy of the model."""
        if self.lora is None:
            raise ValueError(
                "compute_base_log_prob needs LoRA (lora.rank > 0); without adapters the base "
                "model is the trained model, so use a separate reference engine"
            )
        from hf_engines.lora import adapters_disabled

        with adapters_disabled(self.model):
            return self.compute_log_prob(batch, temperature)

    def compute_values(self, batch: DataProto) -> torch.Tensor:
        """Value-head outputs at the response positions; ``(B, R)`` float32 on CPU."""
        if self.config.model.head != "value":
            raise ValueError("compute_values needs model.head='value' (a critic engine)")
        return torch.cat([out["values"] for out in self._forward_only(batch, 1.0)]).cpu()

    # ------------------------------------------------------------------ training

    def _global_sums(self, *values: float) -> list[float]:
        """Sums of ``values`` over every rank (one all-reduce for all of them)."""
        total = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(total)
        return [float(v) for v in total.tolist()]

    def train_step(self, mini_batch: DataProto, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step over this rank's ``mini_batch``; see :class:`TrainingEngine`.

        :meth:`forward_backward` then :meth:`optim_step` with the configured optimizer.
        """
        result = self.forward_backward(mini_batch, loss_fn)
        result.update(self.optim_step())
        return result

    def forward_backward(self, mini_batch: DataProto, loss_fn: LossFn) -> dict[str, float]:
        """Add this rank's ``mini_batch`` gradients to the accumulated ones; no step.

        Every micro-batch gets the mini-batch's token and sequence totals over all ranks
        (:data:`~hf_engines.engine.LossFn`) and returns its share of the mini-batch loss;
        the shares are back-propagated times the world size, since FSDP averages gradients
        over ranks, so the gradient equals one over the whole mini-batch at once. With
        ``fsdp.gradient_sync`` at the last micro-batch, each call reduces once, at its
        last; FSDP2 adds the reduced gradient to the sharded one already there.
        """
        # from_pretrained leaves the model in eval mode, where transformers skips activation
        # checkpointing: a run whose first forward is a training step would hold every
        # block's activations.
        self.model.train()
        temperature = float(mini_batch.meta_info.get(fields.TEMPERATURE, 1.0))
        aligned = self._aligned_micro_batches(mini_batch)
        real_micros = [micro for micro, real in aligned if real]
        tokens, sequences = self._global_sums(*response_counts(real_micros))
        if tokens == 0:
            raise ValueError("the mini-batch has no response tokens (response_mask is all zero)")
        world_size = dist.get_world_size()
        local_loss = 0.0
        sums: dict[str, float] = {}
        with_tokens = 0
        for index, (micro, real) in enumerate(aligned):
            if self._sync_at_last:  # aligned: the same micro-batch is last on every rank
                last, keep = index == len(aligned) - 1, not self.config.fsdp.reshard_after_forward
                defer_gradient_sync(cast(FSDPModule, self.model), last, keep)
            micro = with_totals(micro, tokens, sequences)
            for outputs, mine in self._passes(micro, temperature):
                if not mine:  # another SP rank's rows: back-propagate its zeros with it
                    zero_loss(outputs).backward()
                    continue
                share, metrics = loss_fn(outputs, micro)
                # The alignment repeats (real=False) only keep the collectives in step.
                (share * (world_size if real else 0.0)).backward()
                if real:
                    local_loss += float(share.detach())
                    counted = response_counts([micro])[0] > 0  # a filler's metrics: nothing
                    with_tokens += int(counted)
                    add_metrics(sums, metrics, counted)
            if self.device.type == "cpu":  # this micro-batch's freed activations, before the next
                release_host_memory()
        return global_step_metrics(local_loss, sums, with_tokens, self.device)

    def optim_step(self, hyper: OptimHyper | None = None) -> dict[str, float]:
        """Step on the accumulated gradients and zero them; see :class:`TrainingEngine`.

        ``hyper``: this step's AdamW values and clipping instead of ``optim.*`` and the LR
        schedule (which still counts the step, so a later step without ``hyper`` is where
        the schedule would be).
        """
        # The configured clip is the no-argument call (ulysses_scenarios.py wraps it).
        grad_norm = self._clip_gradients() if hyper is None else self._clip_gradients(hyper)
        # A non-finite norm (the same on every rank) would poison the weights: skip the
        # update, but keep the schedule and step count moving so every rank stays aligned.
        with hyper_params(self.optimizer, hyper):
            if math.isfinite(grad_norm):
                self.optimizer.step()
        lr = float(self.scheduler.get_last_lr()[0]) if hyper is None else hyper.learning_rate
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._global_step += 1
        return {"grad_norm": grad_norm, "lr": lr}

    def _clip_gradients(self, hyper: OptimHyper | None = None) -> float:
        """Clip the global gradient norm (``optim.grad_clip``, or ``hyper``'s if given) and
        return it before clipping."""
        max_norm = self.config.optim.grad_clip if hyper is None else hyper.max_grad_norm
        if max_norm is None:
            # Only the norm: clip_grad_norm_ would also multiply every gradient by 1.0.
            grads = [p.grad for p in self.trainable if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        else:
            norm = torch.nn.utils.clip_grad_norm_(self.trainable, max_norm=max_norm, foreach=True)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm)

    # ------------------------------------------------------------------ state

    def save_checkpoint(self, directory: str | PathLike[str]) -> None:
        """Save model, optimizer, scheduler, step and RNG state (sharded, via DCP).

        With LoRA only the adapters and their optimizer state are saved (the base is
        reloaded from ``model.path``), and ``adapter/`` holds them in peft's layout.
        """
        checkpoint.save_checkpoint(
            Path(directory),
            self.model,
            self.optimizer,
            self.scheduler,
            self._global_step,
            frozen=self.lora is None,
        )
        if dist.get_rank() == 0:
            generation = getattr(self.model, "generation_config", None)
            save_model_metadata(Path(directory), self.config, self.model.config, generation)
        if self.lora is not None:
            self.export_adapter(Path(directory) / "adapter")

    def load_checkpoint(self, directory: str | PathLike[str]) -> None:
        """Restore a checkpoint, possibly saved on a different number of ranks."""
        self._global_step = checkpoint.load_checkpoint(
            Path(directory), self.model, self.optimizer, self.scheduler, frozen=self.lora is None
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
        tokenizer alongside. Gathered and written on rank 0. With LoRA the adapters are
        merged into the weights written (the trained ones stay as they are);
        :meth:`export_adapter` writes the adapter alone.
        """
        export = hf_export(self.config.model, self._model_class, dtype, max_shard_size)
        checkpoint.export_hf(Path(directory), self.model, export, params=self.iter_full_params())

    def export_adapter(self, directory: str | PathLike[str]) -> None:
        """Write the LoRA adapter alone in peft's layout (``adapter_config.json`` +
        ``adapter_model.safetensors``; ``PeftModel.from_pretrained`` loads it). Collective."""
        if self.lora is None:
            raise ValueError(
                "export_adapter needs LoRA (lora.rank > 0); this engine trains every weight, "
                "so export the whole model with export_hf"
            )
        from hf_engines.lora import gather_adapter, write_adapter

        adapter = gather_adapter(self.model)
        if dist.get_rank() == 0:
            write_adapter(Path(directory), self.model, self._peft, adapter, self.config.model.path)
        dist.barrier()

    def iter_full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, full tensor)`` one at a time, with HF ``state_dict()`` names.

        With LoRA each adapted weight is yielded merged (``W + scale * B @ A``) under the
        base model's name: what the rollout and an export need.
        """
        if self.lora is not None:
            from hf_engines.lora import iter_merged_params

            return iter_merged_params(self.model)
        return checkpoint.iter_full_params(self.model)

    def reset_optimizer(self) -> None:
        """Forget the optimizer's state; see :class:`~hf_engines.engine.TrainingEngine`."""
        self.optimizer.state.clear()

    def offload(self) -> None:
        """Move parameters and optimizer state to CPU memory (nothing to do on a CPU run).

        With ``fsdp.cpu_offload`` they already live on the CPU, where FSDP2 keeps them.
        """
        if self.device.type == "cpu" or self.config.fsdp.cpu_offload:
            return
        torch.nn.Module.to(self.model, "cpu")
        move_optimizer_state(self.optimizer, torch.device("cpu"))
        torch.cuda.empty_cache()

    def onload(self) -> None:
        """Bring parameters and optimizer state back to the compute device.

        With ``fsdp.cpu_offload`` they stay on the CPU (FSDP2 copies them in per block).
        """
        if self.device.type == "cpu" or self.config.fsdp.cpu_offload:
            return
        torch.nn.Module.to(self.model, self.device)
        move_optimizer_state(self.optimizer, self.device)
