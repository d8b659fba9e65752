"""The actor's loss in the engine calling convention ``loss_fn(outputs, micro_batch)``.

Bind the hyper-parameters with :func:`functools.partial` (a module-level function, so the
partial pickles through Ray)::

    loss_fn = functools.partial(ppo_actor_loss, clip_low=0.2, clip_high=0.28,
                                loss_agg_mode="token-mean", entropy_coeff=0.0,
                                use_kl_loss=True, kl_loss_coef=0.001,
                                kl_loss_type="low_var_kl")

Its keywords are the field names of the ``actor`` config section
(:class:`hf_algos.config.ActorSection`), so the trainer passes them by name unchanged.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

import torch

from hf_algos.config.correction import RolloutCorrectionSection
from hf_algos.kl import kl_penalty
from hf_algos.losses.aggregation import aggregate_loss, global_share
from hf_algos.losses.entropy import entropy_bonus
from hf_algos.losses.inputs import batch_field, mini_batch_totals
from hf_algos.losses.policy import get_policy_loss
from hf_algos.losses.rollout_correction import compute_rollout_correction
from hf_protocol import DataProto, fields

if TYPE_CHECKING:  # hf_engines imports transformers; only its types are needed here
    from hf_engines import ModelOutputs


def ppo_actor_loss(
    outputs: ModelOutputs,
    micro_batch: DataProto,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    loss_agg_mode: str = "token-mean",
    entropy_coeff: float = 0.0,
    use_kl_loss: bool = False,
    kl_loss_coef: float = 0.001,
    kl_loss_type: str = "low_var_kl",
    policy_loss: str = "ppo",
    rollout_correction: RolloutCorrectionSection | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy loss ``- entropy_coeff * entropy + kl_loss_coef * KL(policy || ref)`` (the KL
    term with ``use_kl_loss`` only).

    Returns the micro-batch's share of the mini-batch loss under the engine's totals
    (:func:`~hf_algos.losses.aggregation.global_share`; its own aggregate without them);
    the metrics are the micro-batch's own aggregates.

    Reads ``outputs["log_probs"]`` (with gradient) and ``outputs["entropy"]``, and from
    ``micro_batch.batch``: ``old_log_probs``, ``advantages``, ``response_mask`` and, when
    ``use_kl_loss``, ``ref_log_prob`` (all ``(b, R)``); when the batch holds
    ``rollout_is_weights`` (rollout correction), they multiply the per-token policy loss
    (not the entropy or KL terms). With ``meta_info["old_log_probs_from_update"]`` the batch
    holds no ``old_log_probs``: the update is one optimizer step, so they are ``log_probs``
    detached; then ``rollout_correction`` (when given and the batch holds
    ``rollout_log_probs``) computes the weights here, from those ``old_log_probs``, and adds
    the ``rollout_correction/*`` metrics. ``policy_loss`` names an entry of
    ``POLICY_LOSSES`` (``ppo``, ``gspo``, ``reinforce``). Metrics: ``pg_loss``,
    ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``, ``entropy`` (when the engine gives
    it) and ``kl_loss`` (when ``ref_log_prob`` is in the batch).
    """
    log_prob = outputs["log_probs"]
    device = log_prob.device
    mask = batch_field(micro_batch, fields.RESPONSE_MASK, device, "the rollout writes")
    old = old_log_probs(micro_batch, log_prob)
    advantages = batch_field(micro_batch, fields.ADVANTAGES, device, "compute_advantage writes")
    weighting, correction_metrics = token_weights(micro_batch, old, mask, rollout_correction)
    policy = get_policy_loss(policy_loss)(
        log_prob,
        old,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=clip_c,
        loss_agg_mode=loss_agg_mode,
        **weighting,
    )
    loss = policy.loss
    metrics = {
        **correction_metrics,
        "pg_loss": float(policy.loss.detach()),
        "pg_clipfrac": float(policy.clipfrac),
        "pg_clipfrac_lower": float(policy.clipfrac_lower),
        "ppo_kl": float(policy.approx_kl),
    }
    bonus = entropy_term(outputs, mask, loss_agg_mode, entropy_coeff)
    if bonus is not None:
        metrics["entropy"] = float(bonus.detach())
        if entropy_coeff:
            loss = loss - entropy_coeff * bonus
    has_ref = micro_batch.batch is not None and fields.REF_LOG_PROB in micro_batch.batch
    if use_kl_loss or has_ref:
        ref = batch_field(
            micro_batch, fields.REF_LOG_PROB, device, "ref.compute_ref_log_prob writes"
        )
        kl_source = log_prob if use_kl_loss else log_prob.detach()
        kl_loss = aggregate_loss(kl_penalty(kl_source, ref, kl_loss_type), mask, loss_agg_mode)
        metrics["kl_loss"] = float(kl_loss.detach())
        if use_kl_loss:
            loss = loss + kl_loss_coef * kl_loss
    # One share for the whole loss: pg, entropy and KL are aggregated with the same mode.
    return global_share(loss, mask, loss_agg_mode, mini_batch_totals(micro_batch)), metrics


def entropy_term(
    outputs: ModelOutputs, mask: torch.Tensor, loss_agg_mode: str, entropy_coeff: float
) -> torch.Tensor | None:
    """The aggregated entropy bonus, or ``None`` when the engine gives no entropy.

    Without a coefficient the entropy is a metric only: it is computed (it is lazy) with
    autograd off, so no ``(tokens, vocabulary)`` tensor is kept for backward. With one, a
    missing entropy is an error naming the fix.
    """
    with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_coeff != 0):
        entropy = outputs.get("entropy")
    if entropy is None:
        if entropy_coeff != 0:
            raise KeyError("entropy_coeff != 0 needs outputs['entropy'] (a causal_lm engine head)")
        return None
    return entropy_bonus(entropy if entropy_coeff else entropy.detach(), mask, loss_agg_mode)


def old_log_probs(micro_batch: DataProto, log_prob: torch.Tensor) -> torch.Tensor:
    """The batch's ``old_log_probs``, or ``log_prob`` detached when the driver says they come
    from this update (``meta_info["old_log_probs_from_update"]``: one optimizer step)."""
    if micro_batch.meta_info.get(fields.OLD_LOG_PROBS_FROM_UPDATE):
        return log_prob.detach()
    return batch_field(
        micro_batch, fields.OLD_LOG_PROBS, log_prob.device, "actor.compute_log_prob writes"
    )


def token_weights(
    micro_batch: DataProto,
    old_log_probs: torch.Tensor,
    mask: torch.Tensor,
    settings: RolloutCorrectionSection | None,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The policy loss's ``token_weights`` keyword (empty: none) and correction metrics.

    Weights the driver wrote (``rollout_is_weights``) are used as they are. Otherwise, with
    ``settings`` and the rollout's ``rollout_log_probs`` in the batch (sent when the
    old log-probs come from the update itself), the correction is computed here against
    ``old_log_probs``. A registered loss without ``token_weights`` keeps working when
    neither is there.
    """
    batch = micro_batch.batch
    if batch is not None and fields.ROLLOUT_IS_WEIGHTS in batch:
        return {"token_weights": batch[fields.ROLLOUT_IS_WEIGHTS].to(mask.device)}, {}
    if settings is None or batch is None or fields.ROLLOUT_LOG_PROBS not in batch:
        return {}, {}
    rollout = batch[fields.ROLLOUT_LOG_PROBS].to(mask.device)
    correction = compute_rollout_correction(old_log_probs, rollout, mask, **asdict(settings))
    weights = {"token_weights": correction.weights} if settings.enabled else {}
    return weights, correction.metrics
