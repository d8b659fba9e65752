"""KL divergence between the policy and the reference, per token, and its coefficient.

Estimators of KL(policy || reference) from samples of the policy, with
``d = log_prob - ref_log_prob`` per token (Schulman, "Approximating KL divergence"):

- ``kl`` (k1): ``d``; unbiased, high variance, can be negative.
- ``abs``: ``|d|``.
- ``mse`` (k2): ``0.5 * d^2``; low variance, biased.
- ``low_var_kl`` (k3): ``exp(-d) + d - 1``, unbiased and non-negative; clamped to
  ``[-10, 10]`` against overflow on outlier tokens.

Used as a reward penalty (:func:`apply_kl_penalty` writes its own field,
``token_level_kl_penalty = beta * kl``, with a :class:`FixedKLController` or
:class:`AdaptiveKLController` for ``beta``; :func:`penalized_rewards` subtracts it from the
scores, the one place ``token_level_rewards`` is made) or as a loss term
(``kl_loss_coef * aggregate_loss(kl_penalty(...))``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch

from hf_algos.masked import masked_mean
from hf_protocol import DataProto, fields

TOKEN_LEVEL_KL_PENALTY: Final = "token_level_kl_penalty"
"""``(B, R)`` float32: ``beta * kl`` per response token (0 on masked tokens), written by
:func:`apply_kl_penalty`; :func:`penalized_rewards` subtracts it from the scores."""

#: k3 values are clamped to this magnitude (an outlier token can give exp(20)).
LOW_VAR_KL_CLAMP: Final[float] = 10.0


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _abs(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.abs()


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    ref_minus_policy = torch.clamp(-log_ratio, -20.0, 20.0)
    value = torch.exp(ref_minus_policy) - ref_minus_policy - 1.0
    return torch.clamp(value, -LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


KL_ESTIMATORS: Final[dict[str, Callable[[torch.Tensor], torch.Tensor]]] = {
    "kl": _k1,
    "k1": _k1,
    "abs": _abs,
    "mse": _k2,
    "k2": _k2,
    "low_var_kl": _k3,
    "k3": _k3,
}
"""Per-token estimators by name, each a function of ``log_prob - ref_log_prob``."""


def kl_estimator(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The per-token estimator ``kind`` of :data:`KL_ESTIMATORS`; the error lists the names."""
    try:
        return KL_ESTIMATORS[kind]
    except KeyError:
        known = ", ".join(KL_ESTIMATORS)
        raise ValueError(f"unknown KL estimator {kind!r}; choose one of {known}") from None


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of the policy against the reference (module docstring lists kinds).

    Shape: ``log_prob`` and ``ref_log_prob`` ``(B, R)``; returns ``(B, R)`` (padding
    positions hold whatever the inputs give; mask them when reducing).
    """
    return kl_estimator(kind)(log_prob - ref_log_prob)


class FixedKLController:
    """A constant KL coefficient ``beta``."""

    def __init__(self, kl_coef: float) -> None:
        """``kl_coef``: the coefficient, >= 0."""
        if kl_coef < 0:
            raise ValueError(f"kl_coef={kl_coef} must be >= 0")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: a fixed coefficient does not adapt."""
        del current_kl, n_steps

    def state_dict(self) -> dict[str, float]:
        """The coefficient, for checkpoints."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore :meth:`state_dict`."""
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adapts ``beta`` so the measured KL tracks ``target_kl`` (Ziegler et al., 2019).

    After each batch: ``error = clip(current_kl / target_kl - 1, -0.2, 0.2)`` and
    ``beta *= 1 + error * n_steps / horizon``.
    """

    def __init__(self, kl_coef: float, target_kl: float, horizon: float) -> None:
        """``kl_coef``: starting beta; ``target_kl``: wanted KL per sequence (> 0);
        ``horizon``: steps over which a 20% error moves beta by 20% (> 0)."""
        if kl_coef < 0 or target_kl <= 0 or horizon <= 0:
            raise ValueError(
                f"need kl_coef >= 0, target_kl > 0 and horizon > 0; got {kl_coef}, "
                f"{target_kl}, {horizon} (e.g. 0.001, 0.1, 10000)"
            )
        self.value = float(kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` toward the coefficient that gives ``target_kl``."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        """The current coefficient, for checkpoints."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore :meth:`state_dict`."""
        self.value = float(state["value"])


KLController = FixedKLController | AdaptiveKLController


def apply_kl_penalty(
    data: DataProto, controller: KLController, kl_penalty: str = "kl"
) -> tuple[DataProto, dict[str, Any]]:
    """Write the reward's KL penalty ``token_level_kl_penalty = beta * kl * response_mask``,
    the KL estimated per token by the estimator ``kl_penalty`` (``algorithm.kl_penalty``).

    Reads ``old_log_probs``, ``ref_log_prob``, ``response_mask`` (all ``(B, R)``) from
    ``data.batch``; updates ``controller`` with the batch's mean per-sequence KL and returns
    ``data`` (modified in place) with metrics ``actor/reward_kl_penalty`` (mean token KL)
    and ``actor/reward_kl_penalty_coeff``. The scores are left alone:
    :func:`penalized_rewards` subtracts the penalty from them.
    """
    batch = _require(data, (fields.OLD_LOG_PROBS, fields.REF_LOG_PROB, fields.RESPONSE_MASK))
    mask = batch[fields.RESPONSE_MASK].to(torch.float32)
    log_ratio = batch[fields.OLD_LOG_PROBS] - batch[fields.REF_LOG_PROB]
    kl = kl_estimator(kl_penalty)(log_ratio) * mask
    beta = controller.value
    batch[TOKEN_LEVEL_KL_PENALTY] = beta * kl
    sequence_kl = masked_mean(kl, mask, dim=-1)
    current_kl = float(sequence_kl.mean())
    controller.update(current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def penalized_rewards(data: DataProto) -> torch.Tensor:
    """``token_level_rewards`` ``(B, R)``: ``token_level_scores`` minus
    ``token_level_kl_penalty`` when :func:`apply_kl_penalty` wrote one, else the scores."""
    batch = _require(data, (fields.TOKEN_LEVEL_SCORES,))
    scores = batch[fields.TOKEN_LEVEL_SCORES]
    if TOKEN_LEVEL_KL_PENALTY in batch.keys():  # noqa: SIM118 (a TensorDict)
        return scores - batch[TOKEN_LEVEL_KL_PENALTY]
    return scores


def _require(data: DataProto, keys: tuple[str, ...]) -> Any:
    """``data.batch``, after checking it holds ``keys``; the error names the missing ones."""
    present = set(data.batch.keys()) if data.batch is not None else set()
    missing = [key for key in keys if key not in present]
    if missing:
        raise KeyError(
            f"the batch lacks {missing}; it holds {sorted(present)}. Compute them first "
            "(rewards, actor.compute_log_prob, ref.compute_ref_log_prob)."
        )
    return data.batch
