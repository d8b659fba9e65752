"""The interface every training engine implements (FSDP2 now; Megatron-core planned).

Batches are :class:`hf_protocol.DataProto` objects with the batch fields of
``docs/architecture.md``: ``input_ids``, ``attention_mask``, ``position_ids`` of shape
``(B, T)`` for prompt + response (prompts left-padded, responses right-padded),
``responses`` and ``response_mask`` of shape ``(B, R)``. Every per-token output is for the
response tokens only, shape ``(B, R)``. The engine knows no RL: losses are pure functions
handed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from os import PathLike
from typing import TYPE_CHECKING, Protocol, TypedDict, runtime_checkable

import torch

from hf_protocol import DataProto, fields

if TYPE_CHECKING:
    from hf_engines.optim import OptimHyper


class ModelOutputs(TypedDict, total=False):
    """What a loss function receives for one micro-batch; all shapes ``(b, R)``."""

    log_probs: torch.Tensor
    """Log-probability of each response token at the batch's temperature (causal LM head)."""
    entropy: torch.Tensor
    """Entropy of the predicted distribution at each response position (causal LM head)."""
    values: torch.Tensor
    """Value estimate at each response position (value head)."""


LossOutput = tuple[torch.Tensor, dict[str, float]]
"""A scalar loss to back-propagate, and metrics (name -> number) to report."""

LossFn = Callable[[ModelOutputs, DataProto], LossOutput]
"""``loss_fn(outputs, micro_batch) -> (share, metrics)``, a pure function.

Global normalisers: once per mini-batch the engine counts the response tokens
(``response_mask.sum()``) and the sequences (rows with at least one response token) over
all data-parallel ranks, and hands them to every micro-batch as
``micro_batch.meta_info[fields.MINI_BATCH_TOTALS] = {"tokens": ..., "sequences": ...}``
(a copy per micro-batch). The loss function returns its micro-batch's **share** of the
mini-batch loss: a sum over its tokens divided by the total tokens (token mean), or a sum
over its sequences divided by the total sequences (sequence means). The shares of all
micro-batches of all ranks add up to the mini-batch loss, so the step is the same whatever
the micro-batch split and the number of ranks. The engine back-propagates the shares (scaled
for how its data-parallel gradient reduction combines ranks) and reports ``loss`` as their
global sum; each metric is averaged over the micro-batches that hold response tokens, of
all data-parallel ranks (every rank reports the same values, so every micro-batch must
return the same metric names).

Called without totals (a unit test calling it directly), a loss uses the micro-batch's own
counts, i.e. it returns the micro-batch's own mean. A micro-batch without response tokens
(a rank's filler row) must give a share of exactly zero.
"""


def mini_batch_total(micro_batch: DataProto, key: str, local: torch.Tensor) -> torch.Tensor:
    """The mini-batch total ``key`` (``"tokens"`` / ``"sequences"``) that the engine put in
    ``micro_batch.meta_info`` (see :data:`LossFn`), or ``local`` (the micro-batch's own count
    as a scalar tensor, at least 1) when the loss is called without one.

    A token-mean loss returns ``masked_sum / mini_batch_total(mb, "tokens", mask.sum())``.
    """
    totals = micro_batch.meta_info.get(fields.MINI_BATCH_TOTALS)
    if totals is None:
        return local.clamp(min=1.0)
    return torch.as_tensor(float(totals[key]), dtype=local.dtype, device=local.device)


@runtime_checkable
class TrainingEngine(Protocol):
    """A model with its optimizer, sharded over the ranks of one worker group.

    Every method is collective: all ranks of the group call it, in the same order, each
    with its own data shard. ``torch.distributed`` must be initialised before building one.
    """

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (restored by :meth:`load_checkpoint`)."""
        ...

    def compute_log_prob(
        self, batch: DataProto, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy of ``batch["responses"]``, no grad; each ``(B, R)`` float32."""
        ...

    def compute_values(self, batch: DataProto) -> torch.Tensor:
        """Value-head outputs at the response positions, no grad; ``(B, R)`` float32."""
        ...

    def train_step(self, mini_batch: DataProto, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step over ``mini_batch``: micro-batches, grad accumulation, clip, LR.

        Collective over the data-parallel ranks, each with its part of the global mini-batch
        (any size >= 1; see :data:`LossFn` for how the loss is normalised). The temperature
        is read from ``mini_batch.meta_info["temperature"]`` (default 1.0).
        Returns the averaged ``loss_fn`` metrics plus ``loss``, ``grad_norm`` and ``lr``.
        Exactly :meth:`forward_backward` then :meth:`optim_step`.
        """
        ...

    def forward_backward(self, mini_batch: DataProto, loss_fn: LossFn) -> dict[str, float]:
        """Forward and backward over ``mini_batch``, adding to the gradients; no step.

        The first half of :meth:`train_step`: micro-batches, the mini-batch totals (of this
        call's ``mini_batch``), back-propagation. Gradients are neither stepped nor zeroed,
        so several calls before one :meth:`optim_step` sum their gradients (a loss that is
        a plain sum, not normalised per call, then steps as one call over all the data).
        Returns the averaged ``loss_fn`` metrics plus ``loss``.
        """
        ...

    def optim_step(self, hyper: OptimHyper | None = None) -> dict[str, float]:
        """One optimizer step on the gradients accumulated since the last one, then zero them.

        Clips the global gradient norm (``optim.grad_clip``, or ``hyper.grad_clip_norm``
        when ``hyper`` is given; 0 there means no clipping), skips the update when the norm
        is not finite, steps the LR schedule and ``global_step``. With ``hyper`` its AdamW
        values are used for this step instead of ``optim.*`` and the LR schedule. Returns
        ``grad_norm`` (before clipping) and ``lr`` (the step's learning rate).
        """
        ...

    def save_checkpoint(self, directory: str | PathLike[str]) -> None:
        """Save model, optimizer, LR scheduler, step and RNG state to ``directory``."""
        ...

    def load_checkpoint(self, directory: str | PathLike[str]) -> None:
        """Restore everything :meth:`save_checkpoint` wrote."""
        ...

    def export_hf(
        self,
        directory: str | PathLike[str],
        dtype: str | torch.dtype | None = None,
        max_shard_size: str | int = "5GB",
    ) -> None:
        """Write a Hugging Face model directory that ``from_pretrained`` loads (collective):
        safetensors shards of at most ``max_shard_size``, weights in ``dtype`` (default: the
        dtype trained in), the source model's tokenizer alongside."""
        ...

    def iter_full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, full tensor)`` one at a time, names as in the HF ``state_dict()``."""
        ...

    def offload(self) -> None:
        """Move parameters and optimizer state to CPU memory between phases."""
        ...

    def onload(self) -> None:
        """Bring parameters and optimizer state back to the compute device."""
        ...

    def reset_optimizer(self) -> None:
        """Forget the optimizer's state (AdamW's moments and step counts): the next step is a
        fresh optimizer's first, on the current weights (weights-only resume)."""
        ...
