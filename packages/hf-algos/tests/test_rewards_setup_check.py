"""Rewards that cannot work stop at set-up (the probe responses), and a reward that keeps
timing out during training trips the circuit: real reward files, real scoring processes."""

from __future__ import annotations

import logging
import textwrap
import time
from pathlib import Path

import pytest

from hf_algos.config.reward import RewardSection
from hf_algos.data import build_char_tokenizer
from hf_algos.rewards import RewardError, RewardManager, RewardSetupError
from hf_controller import ConfigurationError

from .test_rewards_manager import make_batch

REWARDS = textwrap.dedent(
    """
    import math
    import time

    def raises(solution, ground_truth):
        raise ValueError(f"cannot parse {solution!r}")

    def nan(solution, ground_truth):
        return math.nan

    def text(solution, ground_truth):
        return "1.0"

    def nothing(solution, ground_truth):
        return None

    def trl_wrong_length(completions, **kwargs):
        return [1.0] * (len(completions) + 1)

    def hangs(solution, ground_truth):
        time.sleep(3600)

    def empty_fails(solution, ground_truth):
        if not solution:
            raise ValueError("no answer in an empty response")
        return float(solution == ground_truth)

    def hangs_on_wrong(solution, ground_truth):
        if solution != ground_truth:
            time.sleep(3600)
        return 1.0
    """
)


def _manager(tmp_path: Path, name: str, **options: float) -> RewardManager:
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    section = RewardSection(function_path=str(path), function_name=name, **options)  # type: ignore[arg-type]
    return RewardManager.from_config(section, build_char_tokenizer())


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("raises", "ValueError: cannot parse ''"),
        ("nan", "non-finite score nan"),
        ("text", "returned '1.0', not a number"),
        ("nothing", "returned None, not a number"),
        ("trl_wrong_length", "returned 2 scores for 1 samples"),
    ],
)
def test_a_reward_failing_on_every_probe_stops_set_up_in_one_line(
    tmp_path: Path, name: str, said: str
) -> None:
    tokenizer = build_char_tokenizer()
    with (
        _manager(tmp_path, name, num_workers=2) as manager,
        pytest.raises(RewardSetupError) as raised,
    ):
        manager.check(make_batch(tokenizer, [("", "mine", "12")]))
    error = raised.value
    assert isinstance(error, ConfigurationError)  # the CLI: one line, exit 2
    message = str(error)
    assert "\n" not in message, message
    assert f"rewards.py:{name}" in message and "data_source 'mine'" in message, message
    assert "on the response '': error" in message and "on the response '12': error" in message
    assert said in message, message


def test_a_reward_hanging_on_every_probe_stops_set_up(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    with _manager(tmp_path, "hangs", num_workers=2, timeout_s=1.0) as manager:
        start = time.monotonic()
        with pytest.raises(RewardSetupError, match=r"failed on every probe") as raised:
            manager.check_async(make_batch(tokenizer, [("", "mine", "12")])).result(60)
        took = time.monotonic() - start
    assert "timeout (no result within 1 s)" in str(raised.value)
    assert took < 15, took  # the two probes side by side, not every row of a batch


def test_a_reward_failing_on_some_probes_warns_and_scores(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer = build_char_tokenizer()
    with _manager(tmp_path, "empty_fails", num_workers=1) as manager:
        with caplog.at_level(logging.WARNING, logger="hf_algos.rewards.circuit"):
            manager.check(make_batch(tokenizer, [("", "mine", "12")]))
        out = manager.score(make_batch(tokenizer, [("12", "mine", "12")]))
    assert "failed on 1 of 2 probe responses" in caplog.text
    assert "no answer in an empty response" in caplog.text
    assert out.batch["token_level_scores"].sum().item() == 1.0


@pytest.mark.parametrize("workers", [1, 2])
def test_a_reward_that_keeps_timing_out_trips_the_circuit(tmp_path: Path, workers: int) -> None:
    """32 rows whose function hangs, 0.5 s each: stopped after about 3 timeouts, not 32."""
    tokenizer = build_char_tokenizer()
    options = {"num_workers": workers, "timeout_s": 0.5, "max_consecutive_timeouts": 3}
    with _manager(tmp_path, "hangs_on_wrong", **options) as manager:
        manager.start().result(60)  # the processes' start-up is not the circuit's time
        start = time.monotonic()
        with pytest.raises(RewardError) as raised:
            manager.score(make_batch(tokenizer, [("1", "mine", "2")] * 32))
        took = time.monotonic() - start
        message = str(raised.value)
        assert "3 samples in a row timed out" in message, message
        assert "rewards.py:hangs_on_wrong" in message and "reward.timeout_s=0.5 s" in message
        assert "32 x 0.5 s" in message and "max_consecutive_timeouts" in message
        assert took < 5, took  # 32 x 0.5 s over 2 processes = 8 s without it
        # the pool was replaced; the next batch scores
        out = manager.score(make_batch(tokenizer, [("2", "mine", "2")] * 4))
    assert out.batch["token_level_scores"].sum().item() == 4.0


def test_the_circuit_is_off_at_zero_and_resets_on_a_scored_sample(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    options = {"num_workers": 1, "timeout_s": 0.3, "max_consecutive_timeouts": 2}
    rows = [("1", "mine", "2"), ("2", "mine", "2")] * 3  # timeouts never two in a row
    with _manager(tmp_path, "hangs_on_wrong", max_error_fraction=1.0, **options) as manager:
        out = manager.score(make_batch(tokenizer, rows))
    assert out.meta_info["metrics"]["reward/timeouts"] == 3
    options["max_consecutive_timeouts"] = 0
    with _manager(tmp_path, "hangs_on_wrong", max_error_fraction=1.0, **options) as manager:
        out = manager.score(make_batch(tokenizer, [("1", "mine", "2")] * 4))
    assert out.meta_info["metrics"]["reward/timeouts"] == 4


def test_max_consecutive_timeouts_is_checked() -> None:
    with pytest.raises(ConfigurationError, match=r"max_consecutive_timeouts=-1 must be >= 0"):
        RewardSection(max_consecutive_timeouts=-1)
