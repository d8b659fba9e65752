"""Several reward functions with weights, as TRL's ``reward_funcs`` + ``reward_weights``:
``reward.function_name=[a, b] reward.function_weights=[1, 0.5]``. Real functions in a temp
file, scored in real worker processes: the weighted sum, ``None`` left out of a sample's sum,
a sample no function scores is a named failure, per-function metrics, and the errors."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from hf_algos.config import RLConfig, load_config
from hf_algos.config.reward import RewardSection
from hf_algos.data import build_char_tokenizer
from hf_algos.rewards import RewardError, RewardManager
from hf_algos.rewards.user_file import RewardFileError
from hf_algos.rewards.weighted import ALL_NONE, WeightedRewardFunctions
from hf_controller import ConfigurationError
from hf_protocol import DataProto

from .test_rewards_manager import make_batch
from .test_rewards_trl import _trl_batch

REWARDS = textwrap.dedent(
    """
    import re
    import time

    def accuracy_reward(completions, solution, **kwargs):
        # TRL's signature; like trl.rewards.accuracy_reward, None where the solution
        # cannot be checked (here: no solution given), so the sample is left out of it
        contents = [completion[0]["content"] for completion in completions]
        return [
            None if s is None else float(c.strip() == s) for c, s in zip(contents, solution)
        ]

    def format_reward(completions, **kwargs):
        pattern = r"^<think>.*?</think><answer>.*?</answer>$"
        contents = [completion[0]["content"] for completion in completions]
        return [1.0 if re.match(pattern, c) else 0.0 for c in contents]

    def think_only(completions, **kwargs):
        # None for every completion without <think>: with accuracy_reward's None, no function
        # scores the sample
        contents = [completion[0]["content"] for completion in completions]
        return [1.0 if "<think>" in c else None for c in contents]

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        # verl's per-sample signature, with an extra number
        return {"score": float(solution_str == ground_truth), "length": len(solution_str)}

    def length_penalty(completions, **kwargs):
        return [-0.1 * len(c) for c in completions]

    def raises(solution_str, **kwargs):
        raise ValueError("cannot parse " + solution_str)

    def sleeps(solution_str, **kwargs):
        time.sleep(30)
        return 1.0
    """
)
ANSWER = "<think>a</think><answer>4</answer>"


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("weights") / "rewards.py"
    path.write_text(REWARDS)
    return path


def _manager(
    reward_file: Path, names: list[str], weights: list[float] | None, fraction: float = 1.0
) -> RewardManager:
    functions = WeightedRewardFunctions.from_file(str(reward_file), names, weights)
    config = RewardSection(num_workers=1, timeout_s=1.0, max_error_fraction=fraction)
    return RewardManager(build_char_tokenizer(), config, default_function=functions)


@pytest.fixture(scope="module")
def trl_manager(reward_file: Path) -> Iterator[RewardManager]:
    with _manager(reward_file, ["accuracy_reward", "format_reward"], [1.0, 0.5]) as manager:
        yield manager


def _scores(out: DataProto) -> list[float]:
    assert out.batch is not None
    return [round(v, 6) for v in out.batch["token_level_scores"].sum(-1).tolist()]


def test_trl_accuracy_and_format_rewards_with_weights(trl_manager: RewardManager) -> None:
    texts = [ANSWER, "4", "<think>a</think><answer>5</answer>", "5"]
    columns = [{"solution": s} for s in (ANSWER, "4", ANSWER, ANSWER)]
    out = trl_manager.score(_trl_batch(texts, columns))  # type: ignore[arg-type]
    # 1.0 x accuracy + 0.5 x format, by hand
    assert _scores(out) == [1.0 * 1 + 0.5 * 1, 1.0 * 1 + 0.5 * 0, 0.0 + 0.5 * 1, 0.0 + 0.0]
    infos = list(out.non_tensor_batch["reward_extra_info"])
    assert [i["accuracy_reward"] for i in infos] == [1.0, 1.0, 0.0, 0.0]  # unweighted
    assert [i["format_reward"] for i in infos] == [1.0, 0.0, 1.0, 0.0]
    metrics = out.meta_info["metrics"]
    assert metrics["reward/accuracy_reward/mean"] == pytest.approx(0.5)
    assert metrics["reward/format_reward/mean"] == pytest.approx(0.5)
    assert metrics["reward/score/mean"] == pytest.approx((1.5 + 1.0 + 0.5 + 0.0) / 4)
    assert metrics["reward/errors"] == 0.0


def test_none_leaves_a_function_out_of_the_sample_sum(trl_manager: RewardManager) -> None:
    texts = [ANSWER, ANSWER, "4"]
    columns = [{"solution": None}, {"solution": ANSWER}, {"solution": None}]
    out = trl_manager.score(_trl_batch(texts, columns))  # type: ignore[arg-type]
    assert _scores(out) == [0.5, 1.5, 0.0]  # accuracy_reward gave None for samples 0 and 2
    infos = list(out.non_tensor_batch["reward_extra_info"])
    assert "accuracy_reward" not in infos[0] and infos[1]["accuracy_reward"] == 1.0
    assert [i["status"] for i in infos] == ["ok", "ok", "ok"]
    metrics = out.meta_info["metrics"]
    assert metrics["reward/accuracy_reward/mean"] == 1.0  # over the one sample it scored
    assert metrics["reward/format_reward/mean"] == pytest.approx(2 / 3)


def test_a_sample_no_function_scores_is_a_named_failure(reward_file: Path) -> None:
    texts = ["4", ANSWER, "5"]
    columns = [{"solution": None}, {"solution": None}, {"solution": "5"}]
    batch = _trl_batch(texts, columns)
    with _manager(reward_file, ["accuracy_reward", "think_only"], None, fraction=0.5) as manager:
        out = manager.score(batch)  # type: ignore[arg-type]
        assert _scores(out) == [0.0, 1.0, 1.0]
        (report,) = out.meta_info["reward_errors"]
        assert report["index"] == 0 and report["status"] == "error"
        assert ALL_NONE in report["error"] and "accuracy_reward, think_only" in report["error"]
        assert out.meta_info["metrics"]["reward/errors"] == 1.0
        manager.config = dataclasses.replace(
            manager.config, max_error_fraction=0.1
        )  # counted like other failures
        with pytest.raises(RewardError, match=f"(?s)1 of 3 samples failed.*{ALL_NONE}"):
            manager.score(batch)  # type: ignore[arg-type]


def test_per_sample_and_batched_signatures_mix(reward_file: Path) -> None:
    tokenizer = build_char_tokenizer()
    batch = make_batch(tokenizer, [("12", "task", "12"), ("7", "task", "8")])
    with _manager(reward_file, ["compute_score", "length_penalty"], [2.0, 1.0]) as manager:
        out = manager.score(batch)
    assert _scores(out) == [round(2.0 * 1 - 0.2, 6), round(2.0 * 0 - 0.1, 6)]
    infos = list(out.non_tensor_batch["reward_extra_info"])
    assert infos[0]["compute_score"] == 1.0 and infos[0]["compute_score/length"] == 2.0
    assert out.meta_info["metrics"]["reward/length_penalty/mean"] == pytest.approx(-0.15)


def test_a_function_that_raises_or_hangs_fails_the_sample(reward_file: Path) -> None:
    tokenizer = build_char_tokenizer()
    batch = make_batch(tokenizer, [("12", "task", "12")])
    with _manager(reward_file, ["compute_score", "raises", "sleeps"], None) as manager:
        out = manager.score(batch)
    (report,) = out.meta_info["reward_errors"]
    assert report["status"] == "timeout"  # the worse failure is the sample's status
    assert "sleeps: no result within 1 s" in report["error"]
    assert "raises: " in report["error"] and "cannot parse 12" in report["error"]
    metrics = out.meta_info["metrics"]
    assert (metrics["reward/errors"], metrics["reward/timeouts"]) == (1.0, 1.0)
    assert _scores(out) == [0.0]


def test_config_errors_name_both_lengths_and_every_unknown_name(reward_file: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"has 1 weight\(s\) \[1\.0\] but .* names 2"):
        RewardSection(
            function_path=str(reward_file),
            function_name=("accuracy_reward", "format_reward"),
            function_weights=(1.0,),
        )
    with pytest.raises(ConfigurationError, match=r"has 3 weight\(s\).*names 2 function"):
        WeightedRewardFunctions.from_file(str(reward_file), ["a", "b"], [1.0, 2.0, 3.0])
    section = RewardSection(
        function_path=str(reward_file), function_name=("format_reward", "nope", "missing")
    )
    tokenizer = build_char_tokenizer()
    with pytest.raises(
        RewardFileError, match=r"has no functions \['nope', 'missing'\]; its functions are \["
    ):
        RewardManager.from_config(section, tokenizer)
    with pytest.raises(RewardFileError, match=r"lists \['score'\], which would hide"):
        WeightedRewardFunctions([lambda solution: 1.0, lambda solution: 0.0], names=["a", "score"])


def test_weights_or_several_functions_without_a_file_are_refused() -> None:
    """Without reward.function_path, functions registered per data_source score the rows: a
    weight list or several function names would be ignored, so the config refuses them."""
    with pytest.raises(
        ConfigurationError, match=r"function_weights=\[1\.0\] needs reward\.function_path"
    ):
        RewardSection(function_weights=(1.0,))
    with pytest.raises(ConfigurationError, match=r"\['a', 'b'\] .* needs reward\.function_path"):
        RewardSection(function_name=("a", "b"))
    assert RewardSection(function_name="compute_score").function_path is None  # verl's default


def test_the_config_keys_compose_and_build_a_weighted_manager(reward_file: Path) -> None:
    config = load_config(
        RLConfig,
        overrides=[
            *_model(),
            f"reward.function_path={reward_file}",
            "reward.function_name=[accuracy_reward,format_reward]",
            "reward.function_weights=[1,0.5]",
        ],
    )
    reward = config.reward
    assert reward.function_name == ("accuracy_reward", "format_reward")
    assert reward.function_weights == (1.0, 0.5)
    with RewardManager.from_config(reward, build_char_tokenizer()) as manager:
        function = manager.default_function
        assert isinstance(function, WeightedRewardFunctions)
        assert function.names == reward.function_name and function.weights == (1.0, 0.5)
    one = load_config(RLConfig, overrides=[*_model(), "custom_reward_function.name=a"]).reward
    assert one.function_name == "a" and one.function_names == ("a",)  # unchanged for one


def _model() -> list[str]:
    return [
        "+actor.engine.model.hf_config.model_type=llama",
        f"data.tokenizer_path={Path(__file__).parent}",
        "rollout.n=4",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=8",
    ]
