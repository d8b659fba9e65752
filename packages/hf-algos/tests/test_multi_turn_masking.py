"""Multi-turn batches train only on model tokens: tool / environment tokens (``response_mask``
0 inside a response) change neither the actor loss (policy, entropy, KL), nor the reward
KL penalty, nor the advantages of model tokens. Hand-built batches, pure functions; plus
the episode scoring of ``rollout.multi_turn.reward``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_algos.advantages import ADVANTAGE_ESTIMATORS, compute_advantage
from hf_algos.advantages.estimators import compute_gae_advantage_return
from hf_algos.kl import FixedKLController, apply_kl_penalty, penalized_rewards
from hf_algos.losses import LOSS_AGG_MODES, POLICY_LOSSES, ppo_actor_loss
from hf_algos.trainers.ppo.multiturn import (
    MultiTurnScorer,
    combine_episode_scores,
    episode_metrics,
    whole_response_view,
)
from hf_protocol import DataProto, fields

# Two episodes of 8 response tokens: model (1) / tool (0) runs, then padding (attention 0).
MASK = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0], [1, 0, 0, 1, 1, 0, 0, 0]])
ATTENDED = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0, 0]])
TOOL = ATTENDED.bool() & ~MASK.bool()


def randn(seed: int) -> torch.Tensor:
    return torch.randn(MASK.shape, generator=torch.Generator().manual_seed(seed))


def on_tool_tokens(tensor: torch.Tensor, seed: int) -> torch.Tensor:
    """``tensor`` with other (large) values on the tool tokens and the padding."""
    noise = 5 * randn(seed)
    return torch.where(MASK.bool(), tensor, tensor + noise)


def actor_loss(
    log_probs: torch.Tensor, tensors: dict[str, torch.Tensor], policy: str, mode: str
) -> tuple[torch.Tensor, dict[str, float]]:
    batch = DataProto.from_dict({**tensors, fields.RESPONSE_MASK: MASK})
    outputs = {"log_probs": log_probs, "entropy": tensors["entropy"]}
    return ppo_actor_loss(
        outputs,  # type: ignore[arg-type]
        batch,
        loss_agg_mode=mode,
        entropy_coeff=0.01,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        policy_loss=policy,
    )


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("policy", sorted(POLICY_LOSSES))
def test_actor_loss_ignores_tool_tokens(policy: str, mode: str) -> None:
    log_probs = -randn(0).abs()
    tensors = {
        fields.OLD_LOG_PROBS: log_probs - 0.1 * randn(1),
        fields.REF_LOG_PROB: log_probs - 0.2 * randn(2),
        fields.ADVANTAGES: randn(3) * MASK,
        "entropy": randn(4).abs(),
    }
    new = log_probs.clone().requires_grad_(True)
    loss, metrics = actor_loss(new, tensors, policy, mode)
    loss.backward()
    assert new.grad is not None
    assert (new.grad[~MASK.bool()] == 0).all()  # no gradient reaches a tool token

    moved = on_tool_tokens(log_probs, 5).requires_grad_(True)
    changed = {key: on_tool_tokens(value, 6 + i) for i, (key, value) in enumerate(tensors.items())}
    loss_moved, metrics_moved = actor_loss(moved, changed, policy, mode)
    torch.testing.assert_close(loss_moved, loss, atol=1e-6, rtol=0)
    assert metrics_moved == pytest.approx(metrics, abs=1e-6)
    assert metrics["kl_loss"] != 0.0  # the check would be empty without a KL term


def kl_batch(old: torch.Tensor, ref: torch.Tensor) -> DataProto:
    scores = torch.zeros(MASK.shape)
    scores[0, 6], scores[1, 4] = 1.0, 0.5  # on the last model token
    return DataProto.from_dict(
        {
            fields.TOKEN_LEVEL_SCORES: scores,
            fields.OLD_LOG_PROBS: old,
            fields.REF_LOG_PROB: ref,
            fields.RESPONSE_MASK: MASK,
        }
    )


def test_reward_kl_penalty_ignores_tool_tokens() -> None:
    old, ref = -randn(0).abs(), -randn(1).abs()
    base, metrics = apply_kl_penalty(kl_batch(old, ref), FixedKLController(0.1))
    moved, metrics_moved = apply_kl_penalty(
        kl_batch(on_tool_tokens(old, 2), on_tool_tokens(ref, 3)), FixedKLController(0.1)
    )
    assert base.batch is not None and moved.batch is not None
    rewards = penalized_rewards(base)
    torch.testing.assert_close(penalized_rewards(moved), rewards)
    assert metrics_moved == pytest.approx(metrics)
    assert (rewards[TOOL] == 0).all() and (rewards[MASK.bool()] != 0).any()


def test_gae_advantages_of_model_tokens_ignore_tool_values_and_rewards() -> None:
    rewards = torch.zeros(MASK.shape)
    rewards[0, 6], rewards[1, 4] = 1.0, -1.0
    values = randn(0)
    advantages, returns = compute_gae_advantage_return(rewards, values, MASK, gamma=0.9, lam=0.8)
    moved_advantages, moved_returns = compute_gae_advantage_return(
        on_tool_tokens(rewards, 1), on_tool_tokens(values, 2), MASK, gamma=0.9, lam=0.8
    )
    torch.testing.assert_close(moved_advantages, advantages)
    torch.testing.assert_close(moved_returns, returns)
    assert (advantages[~MASK.bool()] == 0).all()
    # The recursion skips the tool run: token 1's next value is token 4's (same episode).
    plain, _ = compute_gae_advantage_return(
        rewards[:1, [0, 1, 4, 5, 6]],
        values[:1, [0, 1, 4, 5, 6]],
        torch.ones(1, 5),
        gamma=0.9,
        lam=0.8,
        whiten=False,
    )
    unwhitened, _ = compute_gae_advantage_return(
        rewards[:1], values[:1], MASK[:1], gamma=0.9, lam=0.8, whiten=False
    )
    torch.testing.assert_close(unwhitened[:1, [0, 1, 4, 5, 6]], plain)


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus", "gae"])
def test_registered_estimators_give_tool_tokens_no_advantage(name: str) -> None:
    scores = torch.zeros(MASK.shape)
    scores[0, 6], scores[1, 4] = 1.0, 0.0
    tensors = {
        fields.TOKEN_LEVEL_REWARDS: scores,
        fields.RESPONSE_MASK: MASK,
        fields.VALUES: randn(1),
    }
    uid = np.array(["a", "a"], dtype=object)
    batch = DataProto.from_dict(tensors, {fields.UID: uid})
    compute_advantage(batch, ADVANTAGE_ESTIMATORS[name])
    assert batch.batch is not None
    advantages = batch.batch[fields.ADVANTAGES]
    assert (advantages[~MASK.bool()] == 0).all() and (advantages[MASK.bool()] != 0).any()


def episode_batch(env_error: list[str]) -> DataProto:
    prompts = torch.full((2, 3), 7)
    responses = torch.arange(16).reshape(2, 8) + 10
    return DataProto.from_dict(
        {
            fields.PROMPTS: prompts,
            fields.RESPONSES: responses,
            fields.RESPONSE_MASK: MASK,
            fields.ATTENTION_MASK: torch.cat([torch.ones(2, 3, dtype=torch.long), ATTENDED], 1),
        },
        {
            fields.NUM_TURNS: np.array([2, 2]),
            fields.TOOL_CALLS: np.array([1, 0]),
            fields.ENV_REWARD: np.array([0.5, 1.5]),
            fields.ENV_ERROR: np.array(env_error, dtype=object),
        },
    )


class LengthScorer:
    """A reward function over the decoded text: the number of response tokens it decodes
    (``response_mask`` 1), on the last of them (as the reward manager places scores)."""

    def __init__(self) -> None:
        self.closed = False

    def score(self, batch: DataProto) -> DataProto:
        assert batch.batch is not None
        mask = batch.batch[fields.RESPONSE_MASK]
        out = torch.zeros(mask.shape)
        last = torch.where(mask.bool(), torch.arange(mask.shape[1]), 0).amax(1)
        out[torch.arange(len(mask)), last] = mask.sum(-1).float()
        return DataProto.from_dict(
            {fields.TOKEN_LEVEL_SCORES: out}, meta_info={fields.METRICS: {"reward/x": 1.0}}
        )

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("function", [7.0, 5.0]), ("environment", [0.5, 1.5]), ("both", [7.5, 6.5])],
)
def test_episode_scores_follow_the_reward_mode_on_the_last_model_token(
    mode: str, expected: list[float]
) -> None:
    inner = LengthScorer()
    scorer = MultiTurnScorer(inner, mode)  # type: ignore[arg-type]
    scored = scorer.score(episode_batch(["", "step timed out"]))
    assert scored.batch is not None
    scores = scored.batch[fields.TOKEN_LEVEL_SCORES]
    # The function saw the whole response (model + tool tokens: 7 and 5 of them).
    assert scores.sum(-1).tolist() == expected
    assert scores[0, 6] == expected[0] and scores[1, 4] == expected[1]  # last model tokens
    metrics = scored.meta_info[fields.METRICS]
    assert metrics["multi_turn/env_errors"] == 1.0  # counted, not raised
    assert metrics["multi_turn/tool_call_rate"] == 0.5
    assert metrics["multi_turn/env_tokens/mean"] == 2.0  # 2 tool tokens in each row
    assert ("reward/x" in metrics) == (mode != "environment")
    scorer.close()
    assert inner.closed


def test_environment_scores_need_no_reward_function() -> None:
    scored = MultiTurnScorer(None, "environment").score(episode_batch(["", ""]))
    assert scored.batch is not None
    assert scored.batch[fields.TOKEN_LEVEL_SCORES].sum(-1).tolist() == [0.5, 1.5]
    with pytest.raises(ValueError, match="needs a reward scorer"):
        MultiTurnScorer(None, "both")


def test_combine_and_view_and_metrics_of_single_turn_batches() -> None:
    function, env = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5])
    assert combine_episode_scores(function, env, "both").tolist() == [1.5, 0.5]
    view = whole_response_view(episode_batch(["", ""]))
    assert view.batch is not None
    assert torch.equal(view.batch[fields.RESPONSE_MASK], ATTENDED)
    single = DataProto.from_dict({fields.RESPONSES: torch.zeros(2, 3)})
    assert episode_metrics(single) == {}
