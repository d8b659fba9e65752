"""reward.function_path / function_name: a user's file, loaded by path in the driver and in
the scoring processes, every accepted signature, errors within seconds, and a GRPO run built
from config alone (no train.py, nothing registered)."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from hf_algos.config import RLConfig, load_config
from hf_algos.config.reward import RewardSection
from hf_algos.data import build_char_tokenizer
from hf_algos.rewards import RewardError, RewardManager
from hf_algos.rewards.user_file import FileScoringFunction, RewardFileError
from hf_algos.trainers import PPOTrainer
from hf_controller import ConfigurationError

from .test_rewards_manager import make_batch
from .trainer_helpers import assert_finite, common_overrides, task_files

REWARD_FILE = textwrap.dedent(
    """
    import re

    DIGITS = re.compile(r"[0-9]+")  # module state, built once per scoring process

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        found = DIGITS.findall(solution_str)
        return {"score": float(bool(found) and found[-1] == str(ground_truth)), "seen": 1.0}

    def ours(solution, ground_truth):
        return float(solution.strip() == str(ground_truth))

    def trl_style(completions, ground_truth, **kwargs):
        return [float(c.strip() == str(t)) for c, t in zip(completions, ground_truth)]

    def broken(text):
        return 0.0
    """
)


def _write(tmp_path: Path, body: str = REWARD_FILE, name: str = "my_reward.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


@pytest.mark.parametrize("name", ["compute_score", "ours", "trl_style"])
def test_each_signature_scores_rows_with_no_registered_function(tmp_path: Path, name: str) -> None:
    tokenizer = build_char_tokenizer()
    function = FileScoringFunction(str(_write(tmp_path)), name)
    rows = [("12", "custom_task", "12"), ("7", "custom_task", "8")]
    with RewardManager(
        tokenizer, RewardSection(num_workers=1), default_function=function
    ) as manager:
        out = manager.score(make_batch(tokenizer, rows))
    assert out.batch["token_level_scores"].sum(-1).tolist() == [1.0, 0.0]


def test_the_file_replaces_builtins_but_not_your_registrations(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    function = FileScoringFunction(str(_write(tmp_path)), "compute_score")
    registry = {"mine": lambda solution, ground_truth: 0.5}
    from hf_algos.rewards.registry import resolve_scoring_function

    assert resolve_scoring_function("mine", registry, function) is registry["mine"]
    assert resolve_scoring_function("gsm8k", None, function) is function  # built-in replaced
    assert resolve_scoring_function("anything", registry, function) is function
    with RewardManager(tokenizer, RewardSection(num_workers=1), None, function) as manager:
        out = manager.score(make_batch(tokenizer, [("x 5", "openai/gsm8k", "5")]))
    assert out.non_tensor_batch["reward_extra_info"][0]["seen"] == 1.0


def test_bad_files_fail_within_seconds_naming_path_name_and_fix(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    path = _write(tmp_path)
    start = time.monotonic()
    with pytest.raises(ConfigurationError, match=r"function_path='nowhere\.py' is not a file"):
        RewardSection(function_path="nowhere.py")
    with pytest.raises(RewardFileError, match=r"has no function 'score_it'.*'compute_score'"):
        RewardManager.from_config(
            RewardSection(function_path=str(path), function_name="score_it"), tokenizer
        )
    failing = _write(tmp_path, "import not_a_module_anywhere\n", "failing.py")
    with pytest.raises(RewardFileError, match=r"failing\.py' failed to import: ModuleNotFound"):
        RewardManager.from_config(RewardSection(function_path=str(failing)), tokenizer)
    with pytest.raises(TypeError, match=r"'text' names no field"):
        RewardManager.from_config(
            RewardSection(function_path=str(path), function_name="broken"), tokenizer
        )
    assert time.monotonic() - start < 10


def test_grpo_from_config_with_a_reward_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    train, _ = task_files(tmp_path)  # data_source sort_digits: registered by nobody here
    reward = _write(tmp_path)
    config = load_config(
        RLConfig,
        overrides=[
            *common_overrides(tiny_model_dir, tmp_path, train, steps=2),
            "algorithm.adv_estimator=grpo",
            f"reward.function_path={reward}",
            "trainer.backend=local",
            "trainer.resume_mode=disable",
            f"trainer.checkpoint_dir={tmp_path / 'ckpt'}",
        ],
    )
    with PPOTrainer(config) as trainer:
        history = trainer.fit()
    assert len(history) == 2
    assert_finite(history, ["reward/seen/mean"])


def test_a_file_too_big_for_the_memory_cap_names_the_cap_and_the_fix(tmp_path: Path) -> None:
    """A file whose import needs more address space than ``reward.max_memory_mb`` (as one
    importing a large library does) is reported as such, not as a bare MemoryError."""
    heavy = _write(tmp_path, "TABLE_SIZE = len(bytearray(3 * 1024**3))\n" + REWARD_FILE)
    tokenizer = build_char_tokenizer()
    function = FileScoringFunction(str(heavy), "ours")
    config = RewardSection(num_workers=1, max_memory_mb=1536)
    expected = r"reward\.max_memory_mb=1536 MiB.*raise reward"
    with RewardManager(tokenizer, config, default_function=function) as manager:
        batch = make_batch(tokenizer, [("1", "custom_task", "1")])
        with pytest.raises(RewardError, match=expected):
            manager.score(batch)
