"""DPO: preference losses (sigmoid, IPO, hinge) and the engine loss function.

Batch convention for DPO training: a pair is two **adjacent rows**, the chosen response at
an even row ``2k`` and the rejected one at ``2k + 1``, both for the same prompt and padded
to the same response length. The reference model's per-token log-probs are in the batch as
``ref_log_prob`` (``(B, R)``, from ``ReferenceWorker.compute_ref_log_prob``). Every split
of the batch must therefore keep pairs whole: the actor's update regroups rank shards and
cuts mini-batches in pairs (``UpdateConfig.row_group_size=2``), and the micro-batch size
must be even (not a token budget); :func:`dpo_loss_fn` raises on an odd micro-batch.

The loss is the mean over the mini-batch's pairs whatever the split: each micro-batch
returns its share, the sum of its pairs' losses over the mini-batch's pair count (half the
engine's sequence total, see :func:`~hf_algos.losses.aggregation.global_share`). A pair
whose rows hold no response token (an engine's filler) adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final, NamedTuple

import torch
from torch.nn.functional import logsigmoid

from hf_algos.losses.aggregation import global_share
from hf_algos.losses.inputs import batch_field, mini_batch_totals
from hf_algos.masked import masked_mean
from hf_protocol import DataProto, fields

if TYPE_CHECKING:  # hf_engines imports transformers; only its types are needed here
    from hf_engines import ModelOutputs


class DPOLossOutput(NamedTuple):
    """Per-pair DPO quantities, each ``(N,)`` for ``N`` pairs."""

    losses: torch.Tensor
    """The loss of each pair (with gradient); minimise its mean."""
    chosen_rewards: torch.Tensor
    """Implicit reward ``beta * (log pi - log pi_ref)`` of the chosen response (no grad)."""
    rejected_rewards: torch.Tensor
    """Implicit reward of the rejected response (no grad)."""


def _sigmoid(margin: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    # Label smoothing treats a fraction of labels as flipped (conservative DPO).
    return -(1 - label_smoothing) * logsigmoid(beta * margin) - label_smoothing * logsigmoid(
        -beta * margin
    )


def _ipo(margin: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    del label_smoothing
    return (margin - 1.0 / (2.0 * beta)) ** 2


def _hinge(margin: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    del label_smoothing
    return torch.relu(1.0 - beta * margin)


DPO_LOSSES: Final[dict[str, Callable[[torch.Tensor, float, float], torch.Tensor]]] = {
    "sigmoid": _sigmoid,
    "ipo": _ipo,
    "hinge": _hinge,
}
"""Per-pair loss of the log-ratio margin ``h``, by name (with ``beta``, ``label_smoothing``):
``sigmoid`` ``-log sigmoid(beta h)`` (DPO), ``ipo`` ``(h - 1/(2 beta))^2`` (IPO, ``h`` from
per-token average log-ratios, see :data:`LENGTH_NORMALISED`), ``hinge``
``max(0, 1 - beta h)`` (SLiC). The same formulas as TRL's ``DPOTrainer`` ``loss_type``."""

LENGTH_NORMALISED: Final[frozenset[str]] = frozenset({"ipo"})
"""Losses whose margin divides each response's log-ratio by its token count. IPO's
squared loss would otherwise grow with response length, and its target ``1/(2 beta)`` is
meant per token: TRL does this, and the IPO authors' reported results use this form."""


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
) -> DPOLossOutput:
    """Preference loss of ``N`` pairs from sequence log-probs, each input ``(N,)``.

    ``h = (log pi(y_w) - log pi(y_l)) - (log pi_ref(y_w) - log pi_ref(y_l))`` and the
    per-pair loss of :data:`DPO_LOSSES` ``[loss_type]``. For the losses in
    :data:`LENGTH_NORMALISED` each log-ratio is first divided by its response's token count
    ``chosen_lengths`` / ``rejected_lengths`` (``(N,)``; ``None``: the log-probs are taken
    as already averaged). The implicit rewards are always the unnormalised
    ``beta * (log pi - log pi_ref)``.
    """
    if beta <= 0:
        raise ValueError(f"beta={beta} must be > 0 (DPO papers use 0.1 to 0.5)")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 0.5)")
    try:
        per_pair = DPO_LOSSES[loss_type]
    except KeyError:
        known = ", ".join(DPO_LOSSES)
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; choose one of {known}") from None
    chosen_ratio = policy_chosen_logps - ref_chosen_logps
    rejected_ratio = policy_rejected_logps - ref_rejected_logps
    chosen_score, rejected_score = chosen_ratio, rejected_ratio
    if loss_type in LENGTH_NORMALISED:
        if chosen_lengths is not None:
            chosen_score = chosen_ratio / chosen_lengths.to(chosen_ratio.dtype).clamp(min=1.0)
        if rejected_lengths is not None:
            rejected_score = rejected_ratio / rejected_lengths.to(rejected_ratio.dtype).clamp(
                min=1.0
            )
    losses = per_pair(chosen_score - rejected_score, beta, label_smoothing)
    return DPOLossOutput(losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach())


def dpo_loss_fn(
    outputs: ModelOutputs,
    micro_batch: DataProto,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO in the engine convention; pairs are adjacent rows (see the module docstring).

    Sequence log-probs are sums over ``response_mask`` of ``outputs["log_probs"]`` and of
    ``ref_log_prob``; the response token counts go to :func:`dpo_loss` (for IPO). Returns
    the micro-batch's share of the mini-batch's mean pair loss (its own mean without the
    engine's totals) and metrics (its own) ``dpo_loss``, ``reward_chosen``,
    ``reward_rejected``, ``reward_margin``, ``reward_accuracy``. Bind the
    hyper-parameters with ``functools.partial(dpo_loss_fn, beta=...)``.
    """
    log_probs = outputs["log_probs"]
    device = log_probs.device
    if log_probs.shape[0] % 2:
        raise ValueError(
            f"a DPO micro-batch holds pairs as adjacent rows, but got {log_probs.shape[0]} "
            "rows; use even batch, mini-batch and micro-batch row counts (not a token budget)"
        )
    mask = batch_field(micro_batch, fields.RESPONSE_MASK, device, "the data loader writes")
    mask = mask.to(log_probs.dtype)
    ref = batch_field(micro_batch, fields.REF_LOG_PROB, device, "ref.compute_ref_log_prob writes")
    policy_seq = (log_probs * mask).sum(-1)
    ref_seq = (ref.to(log_probs.dtype) * mask).sum(-1)
    lengths = mask.sum(-1)
    out = dpo_loss(
        policy_seq[0::2],
        policy_seq[1::2],
        ref_seq[0::2],
        ref_seq[1::2],
        beta=beta,
        loss_type=loss_type,
        label_smoothing=label_smoothing,
        chosen_lengths=lengths[0::2],
        rejected_lengths=lengths[1::2],
    )
    # A pair counts when both rows hold response tokens (2 sequences of the engine's total).
    has_tokens = mask.sum(-1) > 0
    pairs = (has_tokens[0::2] & has_tokens[1::2]).to(log_probs.dtype)
    loss = masked_mean(out.losses, pairs)
    share = global_share(loss, mask, "seq-mean-token-mean", mini_batch_totals(micro_batch))
    margin = out.chosen_rewards - out.rejected_rewards
    metrics = {
        "dpo_loss": float(loss.detach()),
        "reward_chosen": float(out.chosen_rewards.mean()),
        "reward_rejected": float(out.rejected_rewards.mean()),
        "reward_margin": float(margin.mean()),
        "reward_accuracy": float((margin > 0).float().mean()),
    }
    return share, metrics
