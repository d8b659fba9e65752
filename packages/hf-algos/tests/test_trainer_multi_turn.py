"""Multi-turn rollouts through the trainer: token-in-token-out on the trainer's own path
(workers in the driver), and GRPO end to end on Ray with the calculator tool."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer
from hf_algos.trainers.roles.batch_io import absorb, for_worker, generation_phase
from hf_protocol import fields
from hf_rollout.multiturn import ENVIRONMENTS, StepResult, register_environment

from .trainer_helpers import assert_finite, common_overrides, task_files

pytestmark = pytest.mark.timeout(600)

MULTI_TURN_METRICS = (
    "multi_turn/num_turns/mean",
    "multi_turn/tool_calls/mean",
    "multi_turn/tool_call_rate",
    "multi_turn/env_reward/mean",
    "multi_turn/env_tokens/mean",
    "multi_turn/env_errors",
)

LOG_PROB_ATOL = 1e-5
"""fp32 rollout (native engine) vs fp32 actor forward: the same model and kernels, so the
log-probs agree to float rounding (the worker tests use the same bound)."""


@register_environment("test_numbered_replies")
class NumberedReplies:
    """Replies ``[k]`` to the k-th model turn; done after the third. Records, per episode,
    the text of each model turn it was given (the workers run in this process)."""

    seen: ClassVar[list[list[str]]] = []

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        self.texts: list[str] = []
        NumberedReplies.seen.append(self.texts)

    def step(self, model_text: str) -> StepResult:
        self.texts.append(model_text)
        done = len(self.texts) >= 3
        return StepResult(f"[{len(self.texts)}]", reward=0.25, done=done)


def segments(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """Runs of equal mask value: ``(mask, ids)`` in order."""
    runs: list[tuple[int, list[int]]] = []
    for token, bit in zip(ids, mask, strict=True):
        if runs and runs[-1][0] == bit:
            runs[-1][1].append(token)
        else:
            runs.append((bit, [token]))
    return runs


def test_training_ids_are_the_sampled_and_tool_ids_and_log_probs_match(
    toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    torch.set_num_threads(1)
    assert ENVIRONMENTS["test_numbered_replies"] is NumberedReplies
    train, _ = task_files(tmp_path)
    overrides = [
        *common_overrides(tiny_model_dir, tmp_path, train, steps=1),
        "trainer.backend=local",
        "rollout.max_new_tokens=24",
        "rollout.multi_turn.enable=true",
        "rollout.multi_turn.environment=test_numbered_replies",
        "rollout.multi_turn.max_turns=3",
        "rollout.multi_turn.max_tokens_per_turn=5",
        "rollout.multi_turn.reward=both",
    ]
    NumberedReplies.seen.clear()
    with PPOTrainer(load_config(RLConfig, overrides=overrides)) as trainer:
        metrics: dict[str, float] = {}
        with generation_phase(trainer.roles, False, {}):
            batch = trainer.sample(trainer.loader.next_batch(), metrics)
        trainer.score(batch, metrics)
        absorb(batch, trainer.roles.actor.compute_log_prob(for_worker(batch)), metrics)
        tokenizer = trainer.tokenizer
    data = batch.batch
    assert data is not None
    prompts, responses = data[fields.PROMPTS], data[fields.RESPONSES]
    mask = data[fields.RESPONSE_MASK]
    assert responses.shape[1] == 24  # the episode budget: rollout.max_new_tokens
    # The training sequence is the prompt followed by exactly the response ids.
    assert torch.equal(data[fields.INPUT_IDS], torch.cat([prompts, responses], dim=1))
    observed = {text for episode in NumberedReplies.seen for text in episode}
    turns = batch.non_tensor_batch[fields.NUM_TURNS]
    assert len(NumberedReplies.seen) == len(batch) and (turns == 3).all()
    attended = data[fields.ATTENTION_MASK][:, prompts.shape[1] :]
    for row in range(len(batch)):
        keep = attended[row].bool()
        runs = segments(responses[row][keep].tolist(), mask[row][keep].tolist())
        model_runs = [ids for bit, ids in runs if bit == 1]
        tool_runs = [ids for bit, ids in runs if bit == 0]
        assert len(model_runs) == turns[row]
        # Tool tokens: the encoding of the reply, spliced in as ids (no special tokens).
        for k, ids in enumerate(tool_runs, start=1):
            assert ids == tokenizer.encode(f"[{k}]", add_special_tokens=False)
        # Model tokens: what the environment read, kept as the sampled ids (<= 5 a turn).
        for ids in model_runs:
            assert len(ids) <= 5
            assert tokenizer.decode(ids, skip_special_tokens=True) in observed
    model = mask.bool()
    assert not torch.equal(model, attended.bool())  # tool tokens are in the sequence
    torch.testing.assert_close(
        data[fields.OLD_LOG_PROBS][model],
        data[fields.ROLLOUT_LOG_PROBS][model],
        atol=LOG_PROB_ATOL,
        rtol=0,
    )
    assert (data[fields.ROLLOUT_LOG_PROBS][~model] == 0).all()
    # reward=both: env_reward (3 turns x 0.25, or less) + the function's score, on the
    # last model token only.
    scores = data[fields.TOKEN_LEVEL_SCORES]
    last = torch.where(model, torch.arange(model.shape[1]), -1).amax(dim=1)
    assert (scores.sum(-1) == scores[torch.arange(len(batch)), last]).all()
    function = torch.tensor([info["score"] for info in batch.non_tensor_batch["reward_extra_info"]])
    env = torch.tensor(batch.non_tensor_batch[fields.ENV_REWARD].astype(float))
    torch.testing.assert_close(scores.sum(-1), (function + env).float())
    assert metrics["multi_turn/num_turns/mean"] == float(turns.mean())
    assert metrics["multi_turn/env_errors"] == 0.0


@pytest.mark.parametrize("placement", ["hybrid", "separate"])
def test_grpo_with_the_calculator_runs_and_logs_multi_turn_metrics(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path, placement: str
) -> None:
    torch.set_num_threads(1)
    train, _ = task_files(tmp_path)
    overrides = [
        *common_overrides(tiny_model_dir, tmp_path, train, steps=2),
        f"trainer.placement={placement}",
        "rollout.max_new_tokens=16",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "rollout.multi_turn.tools=[calc]",
        "rollout.multi_turn.max_tokens_per_turn=8",
        "rollout.multi_turn.reward=both",
    ]
    with PPOTrainer(load_config(RLConfig, overrides=overrides)) as trainer:
        assert trainer.config.rollout.multi_turn.max_turns == 2
        history = trainer.fit()
    assert len(history) == 2
    assert_finite(history, (*MULTI_TURN_METRICS, "actor/pg_loss", "critic/score/mean"))
    for metrics in history:
        assert 1.0 <= metrics["multi_turn/num_turns/mean"] <= 2.0
