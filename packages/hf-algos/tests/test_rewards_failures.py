"""Rewards fail loudly: call forms, unloadable functions, dead processes, resource caps,
the error-fraction stop, and no processes left behind (real worker processes throughout)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from hf_algos.config import RewardSection
from hf_algos.data import build_char_tokenizer
from hf_algos.rewards import (
    BatchedScoringFunction,
    RewardError,
    RewardManager,
    compute_gsm8k_score,
    register_scoring_function,
    scoring_call,
)
from hf_algos.rewards.pool import exit_cause
from hf_controller.testing import descendant_pids

from .test_rewards_manager import make_batch

BASELINE: set[int] = set()
"""The test process's descendants before any scoring pool (pytest's own, if any)."""


def assert_nothing_left() -> None:
    """A failure replaced the (only) pool: its workers, forkserver and tracker are gone."""
    deadline = time.monotonic() + 5
    while descendant_pids() - BASELINE and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not descendant_pids() - BASELINE, [
        Path(f"/proc/{pid}/cmdline").read_text() for pid in descendant_pids() - BASELINE
    ]


def verl_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None):  # type: ignore[no-untyped-def]
    """verl's form; the data_source is part of the score, so a positional mix-up shows."""
    return {"score": float(solution_str == ground_truth), "is_verl": float(data_source == "verl")}


def trl_score(completions: list[str], **kwargs: Any) -> list[float]:
    """TRL's batched form: dataset columns arrive as keyword lists."""
    truths = kwargs["ground_truth"]
    assert kwargs["data_source"] == ["trl"] * len(completions)
    return [float(c == t) for c, t in zip(completions, truths, strict=True)]


def raising_score(solution: str, ground_truth: Any) -> float:
    """A buggy parser."""
    raise ValueError(f"cannot parse {solution!r}")


def hog_score(solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None) -> float:
    """Allocates far past the memory cap."""
    block = bytearray(2 * 1024**3)
    return float(len(block))


def spinning_score(solution: str, ground_truth: Any, extra_info: Any = None) -> float:
    """Burns CPU inside C code, where the alarm cannot interrupt it (as a stuck native
    parser does): a key derivation of two billion rounds."""
    return float(len(hashlib.pbkdf2_hmac("sha256", b"x", b"salt", 2**31 - 1)))


def killing_score(solution: str, ground_truth: Any) -> float:
    """Dies the way an OOM-killed or segfaulting scorer does."""
    os.kill(os.getpid(), signal.SIGKILL)
    return 0.0


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def unloadable_fn(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A function of a module the driver loaded from a file the workers cannot import."""
    path = tmp_path_factory.mktemp("mod") / "driver_only_scorer.py"
    path.write_text("def score(solution, ground_truth):\n    return 1.0\n")
    spec = importlib.util.spec_from_file_location("driver_only_scorer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["driver_only_scorer"] = module
    spec.loader.exec_module(module)
    yield module.score
    del sys.modules["driver_only_scorer"]


@pytest.fixture(scope="module")
def manager(tokenizer, unloadable_fn) -> Iterator[RewardManager]:  # type: ignore[no-untyped-def]
    registry: dict[str, Any] = {}
    register_scoring_function("verl", verl_score, registry)
    register_scoring_function("trl", trl_score, registry, batched=True)
    register_scoring_function("hybridflow", compute_gsm8k_score, registry)
    register_scoring_function("raise", raising_score, registry)
    register_scoring_function("hog", hog_score, registry)
    register_scoring_function("spin", spinning_score, registry)
    register_scoring_function("kill", killing_score, registry)
    register_scoring_function("unloadable", unloadable_fn, registry)
    # A script's function (defined in __main__): cloudpickle sends it by value.
    main_fn = types.FunctionType(
        verl_score.__code__, {"__name__": "__main__", "float": float}, "main_score"
    )
    main_fn.__module__ = "__main__"
    register_scoring_function("main", main_fn, registry)
    config = RewardSection(num_workers=2, timeout_s=1.0, max_memory_mb=1024, cpu_time_limit_s=1.0)
    BASELINE.update(descendant_pids())
    with RewardManager(tokenizer, config, registry=registry) as reward_manager:
        yield reward_manager
    # Nothing is left behind: pool workers, forkserver and resource tracker are all gone.
    assert_nothing_left()


def test_every_accepted_signature_is_called_by_keyword(manager: RewardManager, tokenizer) -> None:  # type: ignore[no-untyped-def]
    rows = [
        ("12", "verl", "12"),
        ("13", "verl", "12"),
        ("7", "trl", "7"),
        ("8", "trl", "7"),
        ("#### 72", "hybridflow", "72"),
        ("5", "main", "5"),
    ]
    out = manager.score(make_batch(tokenizer, rows))
    assert out.batch["token_level_scores"].sum(-1).tolist() == [1, 0, 1, 0, 1, 1]
    info = out.non_tensor_batch["reward_extra_info"]
    assert info[0]["is_verl"] == 1.0 and info[0]["status"] == "ok"


def test_other_signatures_are_refused_at_registration() -> None:
    with pytest.raises(TypeError, match=r"(?s)'text' names no field.*solution_str, ground_truth"):
        register_scoring_function("x", lambda text, answer: 1.0, {})
    with pytest.raises(TypeError, match="but batched=False was given"):
        register_scoring_function("x", trl_score, {}, batched=False)
    detected: dict = {}  # a `completions` parameter says TRL's batched form by itself
    register_scoring_function("x", trl_score, detected)
    assert isinstance(detected["x"], BatchedScoringFunction)
    # batched, other names are dataset columns (TRL): verl's form then lacks `completions`
    with pytest.raises(TypeError, match=r"it takes no completions parameter"):
        register_scoring_function("x", verl_score, {}, batched=True)
    with pytest.raises(TypeError, match="positional-only"):
        scoring_call(lambda solution, /, ground_truth: 1.0)


def test_an_unloadable_function_is_a_named_error_within_seconds(
    manager: RewardManager,
    tokenizer,  # type: ignore[no-untyped-def]
) -> None:
    start = time.monotonic()
    with pytest.raises(RewardError) as raised:
        manager.score(make_batch(tokenizer, [("1", "unloadable", "1")]))
    assert time.monotonic() - start < 10
    message = str(raised.value)
    assert "data_source 'unloadable'" in message and "driver_only_scorer.score" in message
    assert "No module named 'driver_only_scorer'" in message
    assert descendant_pids() - BASELINE  # a load failure keeps the (healthy) pool


def test_a_killed_scoring_process_is_a_named_error_at_once(
    manager: RewardManager,
    tokenizer,  # type: ignore[no-untyped-def]
) -> None:
    start = time.monotonic()
    died = r"data_source\(s\) \[[^]]*'kill'[^]]*\]: pid \d+ killed by SIGKILL"
    with pytest.raises(RewardError, match=died):
        manager.score(make_batch(tokenizer, [("1", "kill", "1"), ("2", "verl", "2")]))
    assert time.monotonic() - start < 10
    assert_nothing_left()


def test_memory_and_cpu_caps_stop_a_runaway_scorer(manager: RewardManager, tokenizer) -> None:  # type: ignore[no-untyped-def]
    manager.config = dataclasses.replace(manager.config, max_error_fraction=1.0)
    try:
        out = manager.score(make_batch(tokenizer, [("a", "hog", "a"), ("2", "verl", "2")]))
    finally:
        manager.config = dataclasses.replace(manager.config, max_error_fraction=0.1)
    report = out.meta_info["reward_errors"][0]
    assert report["data_source"] == "hog"
    assert "MemoryError (over reward.max_memory_mb=1024)" in report["error"]
    assert out.meta_info["metrics"]["reward/errors"] == 1
    with pytest.raises(RewardError, match=r"\['spin'\]: pid \d+ killed by SIGXCPU"):
        manager.score(make_batch(tokenizer, [("a", "spin", "a")]))
    assert_nothing_left()


def test_too_many_failed_samples_stop_the_step(manager: RewardManager, tokenizer) -> None:  # type: ignore[no-untyped-def]
    rows = [("bad", "raise", "x")] + [("1", "verl", "1")] * 9
    out = manager.score(make_batch(tokenizer, rows))  # 1 of 10: at the limit, scored
    assert out.meta_info["metrics"]["reward/errors"] == 1
    with pytest.raises(RewardError) as raised:
        manager.score(make_batch(tokenizer, [("bad", "raise", "x"), ("1", "verl", "1")]))
    message = str(raised.value)
    assert "1 of 2 samples failed" in message and "max_error_fraction=0.1" in message
    assert "data_source 'raise'" in message and "ValueError: cannot parse 'bad'" in message


def test_the_set_up_check_fails_on_an_unloadable_function(
    manager: RewardManager, tokenizer
) -> None:  # type: ignore[no-untyped-def]
    rows = make_batch(tokenizer, [("", "unloadable", "1")])
    with pytest.raises(RewardError, match="cannot be loaded in the scoring process"):
        manager.check(rows)
    manager.check(make_batch(tokenizer, [("", "verl", "1")]))  # a good one passes


def test_the_set_up_check_in_the_background_raises_the_same_errors(
    manager: RewardManager, tokenizer
) -> None:  # type: ignore[no-untyped-def]
    assert manager.start().result(timeout=60) is None  # processes up before any scoring
    unloadable = manager.check_async(make_batch(tokenizer, [("", "unloadable", "1")]))
    with pytest.raises(RewardError, match="cannot be loaded in the scoring process"):
        unloadable.result(timeout=60)
    with pytest.raises(KeyError, match="no scoring function"):  # resolved now, not later
        manager.check_async(make_batch(tokenizer, [("", "nobody_registered_this", "1")]))
    assert manager.check_async(make_batch(tokenizer, [("", "verl", "1")])).result(60) is None


def test_the_trainers_reward_fails_set_up_not_the_first_step(
    manager: RewardManager,  # keeps the forkserver up, so this pool starts fast
    tokenizer,  # type: ignore[no-untyped-def]
    unloadable_fn: Any,
) -> None:
    from hf_algos.config.reward import RewardSection
    from hf_algos.data import RLDataset, RLDatasetConfig
    from hf_algos.rewards import SCORING_FUNCTIONS

    rows = [{"prompt": "1=", "data_source": "driver_only", "reward_model": {"ground_truth": "1"}}]
    dataset = RLDataset(rows, tokenizer, RLDatasetConfig(max_prompt_length=8))
    register_scoring_function("driver_only", unloadable_fn)
    try:
        with pytest.raises(RewardError, match=r"data_source 'driver_only'.*cannot be loaded"):
            RewardManager.from_config(RewardSection(num_workers=1), tokenizer, dataset)
    finally:
        SCORING_FUNCTIONS.pop("driver_only")


def test_exit_causes_are_named() -> None:
    assert "SIGKILL" in exit_cause(-9) and "SIGXCPU" in exit_cause(-signal.SIGXCPU)
    assert exit_cause(3) == "exited with code 3"


def test_a_script_function_under_main_guard_scores_and_a_killed_driver_leaves_nothing(
    tmp_path: Path,
) -> None:
    """The issue's reproduction: a reward function defined under ``if __name__ ==
    "__main__":`` in a script scores in real worker processes; then the driver is killed
    with SIGKILL mid-scoring and its forkserver, workers and resource tracker all exit."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import time
            from hf_algos.config import RewardSection
            from hf_algos.data import build_char_tokenizer
            from hf_algos.rewards import RewardManager, register_scoring_function
            from hf_protocol import DataProto, right_pad

            if __name__ == "__main__":
                def my_score(data_source, solution_str, ground_truth, extra_info=None):
                    if data_source == "slow":
                        time.sleep(120)
                    return float(solution_str == ground_truth)

                registry = {}
                register_scoring_function("mine", my_score, registry)
                register_scoring_function("slow", my_score, registry)
                tokenizer = build_char_tokenizer()
                ids = [tokenizer("42", add_special_tokens=False)["input_ids"]] * 2
                responses, mask = right_pad(ids, tokenizer.pad_token_id, 3)
                batch = DataProto.from_dict(
                    tensors={"responses": responses, "response_mask": mask},
                    non_tensors={"data_source": ["mine", "slow"],
                                 "reward_model": [{"ground_truth": "42"}] * 2},
                )
                manager = RewardManager(tokenizer, RewardSection(timeout_s=300), registry)
                out = manager.score(batch[:1])
                print("SCORE", out.batch["token_level_scores"].sum().item(), flush=True)
                manager.score_async(batch)
                time.sleep(1)
                print("SCORING", flush=True)
                time.sleep(300)
            """
        )
    )
    driver = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "SCORE 1.0", driver.stderr.read()  # type: ignore[union-attr]
        assert driver.stdout.readline().strip() == "SCORING"
        # resource tracker, forkserver, two scoring processes: the pool starts its processes
        # on demand, so on a loaded machine the last one may appear a moment after "SCORING"
        started = time.monotonic()
        left = descendant_pids(driver.pid)
        while len(left) < 4 and time.monotonic() - started < 30:
            time.sleep(0.2)
            left = descendant_pids(driver.pid)
        assert len(left) >= 4, left
    finally:
        driver.kill()
        driver.wait(30)
    deadline = time.monotonic() + 15
    while any(Path(f"/proc/{pid}").exists() for pid in left) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in left if Path(f"/proc/{pid}").exists()]
