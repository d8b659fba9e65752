"""``trainer.async_mode``: the pure pieces by hand, then GRPO / PPO runs on Ray (separate
placement, tiny model, a few steps): the policy versions the schedule implies, stale groups
dropped and generated again, partial rollouts spanning versions, and exactly-once resume
(the multiset of prompts trained on over an interrupted-and-resumed run equals an
uninterrupted run's)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer
from hf_algos.trainers.async_rollout.partial import PartialGeneration
from hf_algos.trainers.async_rollout.pipeline import GeneratedSamples
from hf_algos.trainers.async_rollout.versions import (
    join_spans,
    mixed_version_rows,
    sample_lags,
    stale_rows,
    staleness_metrics,
    unfinished_rows,
)
from hf_controller import ConfigurationError
from hf_protocol import DataProto, fields

from .trainer_helpers import assert_finite, common_overrides, task_files

pytestmark = pytest.mark.timeout(900)

# ---------------------------------------------------------------------- pure pieces


def test_sample_lags_take_the_oldest_response_token() -> None:
    versions = torch.tensor([[3, 3, 3], [1, 2, 2], [0, 0, 0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    # row 1's oldest token is version 1; row 2 has no response token: its first column
    assert sample_lags(versions, mask, 3).tolist() == [0, 2, 3]


def test_stale_rows_drop_whole_groups() -> None:
    uids = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
    lags = torch.tensor([0, 2, 1, 1, 0, 0])
    assert stale_rows(uids, lags, 1).tolist() == [True, True, False, False, False, False]
    assert stale_rows(uids, lags, 0).tolist() == [True, True, True, True, False, False]


def test_staleness_metrics_count_samples_per_lag() -> None:
    metrics = staleness_metrics(torch.tensor([1, 1, 0, 2]))
    assert metrics == {
        "async/staleness/mean": 1.0,
        "async/staleness/max": 2.0,
        "async/staleness_hist/0": 1.0,
        "async/staleness_hist/1": 2.0,
        "async/staleness_hist/2": 1.0,
    }


def test_join_spans_concatenates_ids_log_probs_and_versions() -> None:
    spans = [
        (torch.tensor([5, 6]), torch.tensor([-0.5, -0.25]), torch.tensor(0)),
        (torch.tensor([7]), torch.tensor([-1.0]), torch.tensor(2)),
    ]
    responses, mask, log_probs, versions = join_spans(spans, width=5, pad_id=9)
    assert responses.tolist() == [5, 6, 7, 9, 9]
    assert mask.tolist() == [1, 1, 1, 0, 0]
    assert log_probs.tolist() == [-0.5, -0.25, -1.0, 0.0, 0.0]
    assert versions.tolist() == [0, 0, 2, 2, 2]
    assert mixed_version_rows(versions[None], mask[None]).tolist() == [True]


def _chunk(responses: list[list[int]], pad: int = 0) -> DataProto:
    """A generated chunk: 1-token prompts, right-padded responses, log-probs -0.1 each."""
    width = max(len(r) for r in responses)
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in responses])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in responses])
    prompts = torch.full((len(responses), 1), 3)
    return DataProto.from_dict(
        {
            fields.PROMPTS: prompts,
            fields.RESPONSES: ids,
            fields.RESPONSE_MASK: mask,
            fields.ROLLOUT_LOG_PROBS: -0.1 * mask.float(),
            fields.INPUT_IDS: torch.cat([prompts, ids], 1),
            fields.ATTENTION_MASK: torch.cat([torch.ones_like(prompts), mask], 1),
            fields.POSITION_IDS: torch.arange(1 + width).repeat(len(responses), 1),
        },
        {fields.UID: np.array(["p"] * len(responses), dtype=object)},
        {fields.TEMPERATURE: 1.0},  # as every rollout output carries it
    )


def test_unfinished_rows_continue_only_full_chunks_without_a_stop() -> None:
    chunk = _chunk([[4, 5], [4, 1], [4]])  # full; full but ends on stop id 1; stopped early
    remaining = torch.tensor([6, 6, 6])
    assert unfinished_rows(chunk, 2, remaining, (1,)).tolist() == [True, False, False]
    # no budget left after a full chunk: done
    assert unfinished_rows(chunk, 2, torch.tensor([2, 6, 6]), (1,)).tolist() == [False] * 3


def test_partial_generation_joins_spans_of_two_versions() -> None:
    partial = PartialGeneration(max_new_tokens=4, chunk_tokens=2, stop_ids=(1,), pad_id=0)
    partial.add(_chunk([[4, 5], [6, 1]]), version=0)  # row 0 continues, row 1 stopped
    request, new_tokens = partial.next_request()
    assert new_tokens == 2 and len(request) == 1
    # the continuation prompt is the original prompt + the response so far, left-padded
    assert request.batch[fields.INPUT_IDS][0, -3:].tolist() == [3, 4, 5]
    partial.add(_chunk([[7, 1]]), version=1)
    assert partial.done
    result = partial.result().batch
    assert result[fields.RESPONSES].tolist() == [[4, 5, 7, 1], [6, 1, 0, 0]]
    assert result[fields.ROLLOUT_POLICY_VERSION][0].tolist() == [0, 0, 1, 1]
    assert result[fields.INPUT_IDS][0].tolist() == [3, 4, 5, 7, 1]
    assert result[fields.ATTENTION_MASK][1].tolist() == [1, 1, 1, 0, 0]


def test_async_mode_needs_the_separate_placement(tiny_model_dir: Path, tmp_path: Path) -> None:
    train, _ = task_files(tmp_path)
    base = common_overrides(tiny_model_dir, tmp_path, train, steps=2)
    with pytest.raises(ConfigurationError, match=r"placement=separate"):
        load_config(RLConfig, overrides=[*base, "trainer.async_mode=one_step_off"])
    with pytest.raises(ConfigurationError, match=r"rollout\.partial"):
        load_config(RLConfig, overrides=[*base, "rollout.partial=true"])


@pytest.mark.parametrize("mode", ["one_step_off", "fully_async"])
def test_async_mode_refuses_the_rollouts_log_probs_as_old(
    tiny_model_dir: Path, tmp_path: Path, mode: str
) -> None:
    """An async step's samples are a version or more old: old_log_probs taken from the
    rollout would put the PPO ratio around the stale policy (async runs collapsed so)."""
    train, _ = task_files(tmp_path)
    base = [
        *common_overrides(tiny_model_dir, tmp_path, train, steps=2),
        "trainer.placement=separate",
        f"trainer.async_mode={mode}",
    ]
    with pytest.raises(ConfigurationError, match=r"actor\.use_rollout_log_probs=false"):
        load_config(RLConfig, overrides=[*base, "actor.use_rollout_log_probs=true"])
    config = load_config(RLConfig, overrides=base)  # the default recomputes them
    assert not config.actor.use_rollout_log_probs
    synchronous = [*base[:-2], "actor.use_rollout_log_probs=true"]  # on-policy: equal
    assert load_config(RLConfig, overrides=synchronous).actor.use_rollout_log_probs


# ---------------------------------------------------------------------- runs on Ray


class RecordingTrainer(PPOTrainer):
    """A PPO trainer that records the prompts of every step and can stop at a step (as if
    the driver were killed there, after its last checkpoint)."""

    stop_at: int | None = None

    def train_on_samples(self, samples: GeneratedSamples) -> dict[str, float]:
        if self.stop_at is not None and self.global_step >= self.stop_at:
            raise KeyboardInterrupt(f"killed at step {self.global_step}")
        rows = samples.batch.non_tensor_batch[fields.RAW_PROMPT]
        self.prompts.append(sorted(map(str, rows)))
        return super().train_on_samples(samples)

    prompts: list[list[str]]


def run(overrides: list[str], stop_at: int | None = None) -> tuple[list[Any], list[list[str]]]:
    torch.set_num_threads(1)
    trainer = RecordingTrainer(load_config(RLConfig, overrides=overrides))
    trainer.prompts, trainer.stop_at = [], stop_at
    with trainer:
        try:
            history = trainer.fit()
        except KeyboardInterrupt:
            history = trainer.history
    return history, trainer.prompts


def async_overrides(model: Path, root: Path, mode: str, steps: int) -> list[str]:
    train, _ = task_files(root)
    return [
        *common_overrides(model, root, train, steps=steps),
        "trainer.placement=separate",
        f"trainer.async_mode={mode}",
        f"trainer.checkpoint_dir={root / 'ckpt'}",
        "algorithm.rollout_correction.mode=tis",
    ]


PARTIAL = [  # fully_async, three queued, 2-token chunks: generations span a push
    "trainer.queue_size=3",
    "trainer.max_staleness=3",
    "rollout.max_new_tokens=8",
    "rollout.partial=true",
    "rollout.partial_chunk_tokens=2",
]
FINITE = ("actor/pg_loss", "actor/grad_norm", "async/staleness/mean", "async/wait_s")


def resumed_prompts(overrides: list[str], stop_at: int) -> list[list[str]]:
    """Prompts of a run killed at step ``stop_at`` (checkpoints every 2 steps) and resumed."""
    first, before = run([*overrides, "trainer.save_freq=2"], stop_at=stop_at)
    assert len(first) == stop_at - 1
    second, after = run([*overrides, "trainer.save_freq=2", "trainer.resume_mode=auto"])
    assert second[0]["training/global_step"] == 3.0  # resumed from the step-2 checkpoint
    return before[:2] + after


def multiset(steps: list[list[str]]) -> Counter[str]:
    return Counter(p for step in steps for p in step)


def test_one_step_off_lags_by_one_and_resumes_exactly_once(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    overrides = async_overrides(tiny_model_dir, tmp_path / "a", "one_step_off", steps=4)
    history, prompts = run([*overrides, "trainer.resume_mode=disable"])
    assert len(history) == 4
    assert_finite(history, FINITE)
    rows = 4 * 2
    # step 1 trains on the initial weights' samples; after it, batch t+1 was generated
    # with the weights of step t-1 while step t trained: every sample lags by exactly one
    assert history[0]["async/staleness_hist/0"] == rows
    for metrics in history[1:]:
        assert metrics["async/staleness_hist/1"] == rows
        assert metrics["async/staleness/max"] == 1.0
    resumed = resumed_prompts(async_overrides(tiny_model_dir, tmp_path / "b", "one_step_off", 4), 3)
    assert multiset(resumed) == multiset(prompts)


def test_fully_async_drops_stale_groups_and_resumes_exactly_once(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    def overrides(root: Path) -> list[str]:
        return [
            *async_overrides(tiny_model_dir, root, "fully_async", steps=4),
            "trainer.queue_size=2",
            "trainer.max_staleness=0",
        ]

    history, prompts = run([*overrides(tmp_path / "a"), "trainer.resume_mode=disable"])
    assert len(history) == 4
    assert_finite(history, FINITE)
    # queued two ahead, a batch is one or two versions old: all dropped and generated again
    # with the trainer's weights, so what is trained on lags by 0
    assert history[0]["async/stale_dropped"] == 0.0
    assert all(m["async/stale_dropped"] == 8.0 for m in history[1:])
    assert all(m["async/staleness/max"] == 0.0 for m in history)
    assert history[-1]["async/stale_dropped_total"] == 24.0
    assert [len(p) for p in prompts] == [8] * 4  # 4 prompts x 2: none lost when dropped
    assert multiset(resumed_prompts(overrides(tmp_path / "b"), 3)) == multiset(prompts)


def test_fully_async_partial_rollout_ppo_spans_versions(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    overrides = [
        *async_overrides(tiny_model_dir, tmp_path, "fully_async", steps=4),
        "trainer.resume_mode=disable",
        *PARTIAL,
        "algorithm.adv_estimator=gae",
        f"critic.engine.model.path={tiny_model_dir}",
        "critic.ppo_mini_batch_size=4",
    ]
    history, _ = run(overrides)
    assert len(history) == 4
    assert_finite(history, (*FINITE, "critic/vf_loss", "async/mixed_version_samples"))
    # generations queued behind a push continue with the new weights
    assert sum(m["async/mixed_version_samples"] for m in history) > 0
