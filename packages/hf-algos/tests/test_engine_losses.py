"""ppo_actor_loss / critic_loss in the engine convention: composition, metrics, pickling."""

from __future__ import annotations

import functools
import math
import pickle

import pytest
import torch

from hf_algos.kl import kl_penalty
from hf_algos.losses import critic_loss, ppo_actor_loss, ppo_policy_loss
from hf_protocol import DataProto

MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
OLD = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.5, -1.0]])
NEW = torch.tensor([[-0.8, -2.1, -7.0], [-0.5, -1.0, -1.2]])
REF = torch.tensor([[-1.2, -2.0, 0.0], [-0.7, -1.4, -0.9]])
ADV = torch.tensor([[1.0, 1.0, 0.0], [-0.5, -0.5, -0.5]])
ENTROPY = torch.tensor([[2.0, 1.0, 5.0], [0.5, 0.5, 0.5]])


def micro_batch(**extra: torch.Tensor) -> DataProto:
    tensors = {"response_mask": MASK, "old_log_probs": OLD, "advantages": ADV, **extra}
    return DataProto.from_dict(tensors=tensors)


def test_actor_loss_composes_policy_entropy_and_kl() -> None:
    log_prob = NEW.clone().requires_grad_(True)
    outputs = {"log_probs": log_prob, "entropy": ENTROPY}
    loss, metrics = ppo_actor_loss(
        outputs,  # type: ignore[arg-type]
        micro_batch(ref_log_prob=REF),
        clip_low=0.2,
        clip_high=0.28,
        entropy_coeff=0.01,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        kl_loss_type="low_var_kl",
    )
    pg = ppo_policy_loss(NEW, OLD, ADV, MASK, clip_low=0.2, clip_high=0.28)
    entropy = (2.0 + 1.0 + 0.5 * 3) / 5
    kl = (kl_penalty(NEW, REF, "low_var_kl") * MASK).sum() / 5
    assert loss.item() == pytest.approx(pg.loss.item() - 0.01 * entropy + 0.1 * kl.item())
    assert set(metrics) == {
        "pg_loss",
        "pg_clipfrac",
        "pg_clipfrac_lower",
        "ppo_kl",
        "entropy",
        "kl_loss",
    }
    assert metrics["entropy"] == pytest.approx(entropy)
    assert metrics["kl_loss"] == pytest.approx(kl.item())
    assert metrics["pg_loss"] == pytest.approx(pg.loss.item())
    loss.backward()
    assert log_prob.grad is not None and log_prob.grad[0, 2] == 0.0  # padding gets no gradient


def test_actor_loss_without_kl_or_entropy_terms() -> None:
    outputs = {"log_probs": NEW.clone().requires_grad_(True), "entropy": ENTROPY}
    loss, metrics = ppo_actor_loss(outputs, micro_batch(), policy_loss="reinforce")  # type: ignore[arg-type]
    expected = -(ADV * NEW * MASK).sum() / 5
    assert loss.item() == pytest.approx(expected.item())
    assert "kl_loss" not in metrics and metrics["pg_clipfrac"] == 0.0
    with pytest.raises(KeyError, match="ref_log_prob"):
        ppo_actor_loss(outputs, micro_batch(), use_kl_loss=True, kl_loss_coef=0.1)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match=r"old_log_probs.*actor\.compute_log_prob"):
        ppo_actor_loss(outputs, DataProto.from_dict(tensors={"response_mask": MASK}))  # type: ignore[arg-type]


def test_critic_loss_metrics() -> None:
    batch = DataProto.from_dict(
        tensors={
            "response_mask": torch.tensor([[1, 1, 0]]),
            "values": torch.tensor([[0.5, 0.5, 0.0]]),
            "returns": torch.tensor([[1.5, 0.0, 0.0]]),
        }
    )
    vpreds = torch.tensor([[1.0, 2.0, 5.0]], requires_grad=True)
    loss, metrics = critic_loss({"values": vpreds}, batch, cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 4.0) / 2)
    assert metrics == pytest.approx({"vf_loss": 1.16, "vf_clipfrac": 0.5, "vpred_mean": 1.5})


def test_partials_pickle_and_give_the_same_loss() -> None:
    loss_fn = functools.partial(
        ppo_actor_loss, clip_low=0.2, clip_high=0.28, use_kl_loss=True, kl_loss_coef=0.05
    )
    restored = pickle.loads(pickle.dumps(loss_fn))
    outputs = {"log_probs": NEW, "entropy": ENTROPY}
    batch = micro_batch(ref_log_prob=REF)
    assert restored(outputs, batch)[0].item() == loss_fn(outputs, batch)[0].item()
    critic = pickle.loads(pickle.dumps(functools.partial(critic_loss, cliprange_value=0.5)))
    assert critic.func is critic_loss


def test_all_zero_mask_gives_finite_loss_and_gradient() -> None:
    log_prob = NEW.clone().requires_grad_(True)
    batch = DataProto.from_dict(
        tensors={
            "response_mask": torch.zeros_like(MASK),
            "old_log_probs": OLD,
            "advantages": ADV,
            "ref_log_prob": REF,
        }
    )
    loss, metrics = ppo_actor_loss(
        {"log_probs": log_prob, "entropy": ENTROPY},  # type: ignore[arg-type]
        batch,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        entropy_coeff=0.01,
    )
    loss.backward()
    assert loss.item() == 0.0 and all(math.isfinite(v) for v in metrics.values())
    assert log_prob.grad is not None and torch.isfinite(log_prob.grad).all()


@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_a_metric_only_entropy_is_computed_outside_the_graph(entropy_coeff: float) -> None:
    """The engine's entropy is lazy; with no coefficient the loss computes it with autograd
    off (no (tokens, vocabulary) tensor kept for backward), with one it is in the loss."""
    from hf_engines.fsdp.outputs import LazyOutputs

    logits = torch.randn(2, 3, 11, requires_grad=True)
    log_softmax = torch.log_softmax(logits, dim=-1)
    grad_on: list[bool] = []

    def entropy() -> torch.Tensor:
        grad_on.append(torch.is_grad_enabled())
        return -(log_softmax.exp() * log_softmax).sum(dim=-1)

    log_probs = log_softmax.gather(-1, torch.tensor([[1, 2, 3], [4, 5, 6]]).unsqueeze(-1))
    outputs = LazyOutputs({"log_probs": log_probs.squeeze(-1)}, {"entropy": entropy})
    loss, metrics = ppo_actor_loss(outputs, micro_batch(), entropy_coeff=entropy_coeff)  # type: ignore[arg-type]
    assert grad_on == [entropy_coeff != 0.0]
    expected = torch.distributions.Categorical(logits=logits.detach()).entropy()
    assert metrics["entropy"] == pytest.approx(float((expected * MASK).sum() / MASK.sum()))
    loss.backward()  # the policy term's gradient either way
    assert logits.grad is not None and logits.grad.abs().sum() > 0
