"""Reward faults: a function the workers cannot load, a scoring process killed mid-batch,
a scorer over its memory cap or CPU-time limit, a batch with too many failed samples, and a
function that hangs (at the set-up check, and during training: the circuit).

Each case scores a real batch in real scoring processes (hf_algos.rewards.RewardManager),
asserts what the error names, and checks that no process is left behind afterwards.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faults import FaultCase, FaultResult, first_line, stopwatch
from reward_scorers import (
    exact_score,
    hang_score,
    hog_score,
    pid_then_sleep_score,
    raising_score,
    spin_score,
)

from hf_algos.config import RewardSection
from hf_algos.data import build_char_tokenizer
from hf_algos.rewards import (
    RewardError,
    RewardManager,
    RewardSetupError,
    register_scoring_function,
)
from hf_controller import ConfigurationError
from hf_controller.testing import descendant_pids
from hf_protocol import DataProto, right_pad


def _batch(rows: list[tuple[str, str, str]], extra: dict[str, Any] | None = None) -> DataProto:
    tokenizer = build_char_tokenizer()
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] + [3] for text, _, _ in rows]
    responses, mask = right_pad(ids, tokenizer.pad_token_id, max(map(len, ids)) + 1)
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={
            "data_source": [source for _, source, _ in rows],
            "reward_model": [{"ground_truth": truth} for _, _, truth in rows],
            "extra_info": [dict(extra or {}) for _ in rows],
        },
    )


def _scored(
    functions: dict[str, Callable[..., Any]],
    act: Callable[[RewardManager], FaultResult],
    **config: Any,
) -> FaultResult:
    """Run ``act`` on a fresh manager; afterwards no scoring process may be left."""
    before = descendant_pids()
    registry: dict[str, Any] = {}
    for name, fn in functions.items():
        register_scoring_function(name, fn, registry)
    options = {"num_workers": 2, "timeout_s": 2.0, **config}
    with RewardManager(build_char_tokenizer(), RewardSection(**options), registry) as m:
        m.score(_batch([("1", "exact", "1")]))  # the pool is up: time only the fault
        result = act(m)
    deadline = time.monotonic() + 5
    while descendant_pids() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    left = descendant_pids() - before
    assert not left, f"processes left behind: {sorted(left)}"
    return result


def _error_of(manager: RewardManager, batch: DataProto) -> tuple[str, float]:
    with stopwatch() as elapsed:
        try:
            manager.score(batch)
        except RewardError as error:
            return str(error), elapsed()
    raise AssertionError("the batch was scored; a RewardError was expected")


def unloadable(scratch: Path) -> FaultResult:
    """A function from a module the driver loaded from a file the workers cannot import."""
    path = scratch / "driver_only_reward.py"
    path.write_text("def score(solution, ground_truth):\n    return 1.0\n")
    spec = importlib.util.spec_from_file_location("driver_only_reward", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["driver_only_reward"] = module
    try:
        spec.loader.exec_module(module)

        def act(manager: RewardManager) -> FaultResult:
            message, seconds = _error_of(manager, _batch([("1", "mine", "1")]))
            assert "data_source 'mine'" in message and "driver_only_reward.score" in message
            assert "No module named 'driver_only_reward'" in message, message
            return FaultResult("named error", seconds, "nothing", first_line(message))

        return _scored({"exact": exact_score, "mine": module.score}, act)
    finally:
        del sys.modules["driver_only_reward"]


def killed(scratch: Path) -> FaultResult:
    """SIGKILL a scoring process while it scores."""
    pid_file = scratch / "scorer.pid"

    def act(manager: RewardManager) -> FaultResult:
        batch = _batch([("1", "slow", "1"), ("1", "exact", "1")], {"pid_file": str(pid_file)})
        future = manager.score_async(batch)
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the scorer never started"
            time.sleep(0.05)
        with stopwatch() as elapsed:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
            try:
                future.result(timeout=60)
            except RewardError as error:
                message, seconds = str(error), elapsed()
            else:
                raise AssertionError("the batch was scored; a RewardError was expected")
        assert "died while scoring data_source(s) [" in message and "'slow'" in message, message
        assert "killed by SIGKILL" in message, message
        return FaultResult("named error", seconds, "that batch's scores", first_line(message))

    return _scored({"exact": exact_score, "slow": pid_then_sleep_score}, act, timeout_s=60.0)


def over_memory(scratch: Path) -> FaultResult:
    """A scorer that allocates past ``max_memory_mb``: that sample's MemoryError."""

    def act(manager: RewardManager) -> FaultResult:
        with stopwatch() as elapsed:
            out = manager.score(_batch([("1", "hog", "1")] + [("1", "exact", "1")] * 9))
        report = out.meta_info["reward_errors"][0]
        assert report["data_source"] == "hog", report
        assert "MemoryError (over reward.max_memory_mb=2048)" in report["error"], report
        assert out.meta_info["metrics"]["reward/errors"] == 1
        detail = f"sample 0 (data_source 'hog') scored 0 after error: {report['error']}"
        return FaultResult(
            "named error", elapsed(), "that sample's score (0, counted)", first_line(detail)
        )

    return _scored({"exact": exact_score, "hog": hog_score}, act, max_memory_mb=2048)


def over_cpu(scratch: Path) -> FaultResult:
    """A scorer burning CPU where the alarm cannot reach: killed by its CPU-time limit."""

    def act(manager: RewardManager) -> FaultResult:
        message, seconds = _error_of(manager, _batch([("1", "spin", "1")]))
        assert "['spin']" in message and "SIGXCPU" in message, message
        return FaultResult("named error", seconds, "that batch's scores", first_line(message))

    return _scored({"exact": exact_score, "spin": spin_score}, act, cpu_time_limit_s=1.0)


def error_fraction(scratch: Path) -> FaultResult:
    """3 of 4 samples raise, over the default ``max_error_fraction`` of 0.1."""

    def act(manager: RewardManager) -> FaultResult:
        rows = [("a", "raise", "1"), ("b", "raise", "1"), ("c", "raise", "1"), ("1", "exact", "1")]
        message, seconds = _error_of(manager, _batch(rows))
        assert "3 of 4 samples failed" in message and "max_error_fraction=0.1" in message
        assert "data_source 'raise'" in message and "ValueError: cannot parse 'a'" in message
        return FaultResult("named error", seconds, "nothing (the step stops)", first_line(message))

    return _scored({"exact": exact_score, "raise": raising_score}, act)


def hangs_at_set_up(scratch: Path) -> FaultResult:
    """The set-up check's probes (an empty response, the ground truth) both time out: the
    run stops there, one line, exit 2 in the ``hybridflow`` command."""

    def act(manager: RewardManager) -> FaultResult:
        with stopwatch() as elapsed:
            try:
                manager.check_async(_batch([("", "hang", "12")])).result(60)
            except RewardSetupError as error:
                seconds, message = elapsed(), str(error)
            else:
                raise AssertionError("the set-up check passed a function that hangs")
        assert isinstance(RewardSetupError("x"), ConfigurationError) and "\n" not in message
        assert "reward_scorers.hang_score" in message and "failed on every probe" in message
        assert "timeout (no result within 2 s)" in message, message
        return FaultResult("named error", seconds, "nothing (before any step)", first_line(message))

    return _scored({"exact": exact_score, "hang": hang_score}, act)


def hangs_in_training(scratch: Path) -> FaultResult:
    """A 32-row batch whose function hangs, 1 s timeout, 2 processes: the circuit stops it
    after 4 timeouts in a row (about 4 s), not after 32 x 1 s / 2 processes = 16 s."""

    def act(manager: RewardManager) -> FaultResult:
        message, seconds = _error_of(manager, _batch([("1", "hang", "12")] * 32))
        assert "4 samples in a row timed out" in message and "hang_score" in message, message
        assert seconds < 12, seconds
        return FaultResult("named error", seconds, "nothing (the step stops)", first_line(message))

    return _scored({"exact": exact_score, "hang": hang_score}, act, timeout_s=1.0)


FAULTS = [
    FaultCase("reward function cannot be loaded", unloadable),
    FaultCase("reward process killed (SIGKILL mid-batch)", killed),
    FaultCase("reward over memory cap", over_memory),
    FaultCase("reward over CPU-time limit (stuck in C code)", over_cpu),
    FaultCase("reward errors above max_error_fraction", error_fraction),
    FaultCase("reward hangs on every probe (set-up check)", hangs_at_set_up),
    FaultCase("reward hangs during training (circuit)", hangs_in_training),
]
