"""RewardManager on real scoring functions in real worker processes: ok, raising, hanging."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch

from hf_algos.config import RewardSection
from hf_algos.data import build_char_tokenizer
from hf_algos.rewards import (
    RewardError,
    RewardManager,
    register_scoring_function,
)
from hf_controller import ConfigurationError
from hf_protocol import DataProto, right_pad

from .toy_task import SORT_DIGITS_SOURCE, score_sorted_digits

# Scoring functions used by the tests. They run in spawned worker processes, which import
# this module by name, so they live at module level.


def raising_score(solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None) -> float:
    """Fails the way a buggy parser does."""
    raise ValueError(f"cannot parse {solution!r}")


def sleeping_score(solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None) -> float:
    """Hangs far past any timeout (in Python, so the alarm interrupts it)."""
    time.sleep(60)
    return 1.0


def alarm_blocking_score(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None
) -> float:
    """Hangs with the alarm signal blocked, as code stuck outside the interpreter would."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)
    return 1.0


def exiting_score(solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None) -> float:
    """Kills its own worker process."""
    os._exit(3)


def length_score(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None
) -> dict[str, float]:
    """A score with an extra number to report."""
    return {"score": 0.25, "length": float(len(solution))}


def locked_score(solution: str, ground_truth: Any, lock: Any = None) -> float:
    """Holds a lock (through a partial), which cannot travel to a worker process."""
    return 1.0


def _registry() -> dict[str, Any]:
    registry: dict[str, Any] = {}
    for name, fn in (
        (SORT_DIGITS_SOURCE, score_sorted_digits),
        ("raise", raising_score),
        ("hang", sleeping_score),
        ("block", alarm_blocking_score),
        ("exit", exiting_score),
        ("length", length_score),
    ):
        register_scoring_function(name, fn, registry=registry)
    return registry


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def manager(tokenizer) -> Iterator[RewardManager]:  # type: ignore[no-untyped-def]
    config = RewardSection(
        num_workers=2, timeout_s=1.0, hard_timeout_grace_s=60.0, max_error_fraction=1.0
    )
    with RewardManager(tokenizer, config, registry=_registry()) as reward_manager:
        yield reward_manager


def make_batch(tokenizer, samples: list[tuple[str, str, str]]) -> DataProto:  # type: ignore[no-untyped-def]
    """A rollout-like batch of (response text, data_source, ground truth), each + <eos>."""
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] + [3] for text, _, _ in samples]
    responses, response_mask = right_pad(ids, tokenizer.pad_token_id, max(map(len, ids)) + 1)
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": response_mask},
        non_tensors={
            "data_source": [source for _, source, _ in samples],
            "reward_model": [{"ground_truth": truth} for _, _, truth in samples],
            "extra_info": [{"index": i} for i in range(len(samples))],
        },
    )


def test_scores_land_on_the_last_response_token(manager: RewardManager, tokenizer) -> None:  # type: ignore[no-untyped-def]
    batch = make_batch(
        tokenizer,
        [
            ("123456", "sort_digits", "123456"),
            ("173456", "sort_digits", "123456"),
            ("ab", "length", ""),
        ],
    )
    assert manager.decode_responses(batch) == ["123456", "173456", "ab"]
    out = manager.score(batch)
    scores = out.batch["token_level_scores"]
    assert scores.shape == batch.batch["responses"].shape and scores.dtype == torch.float32
    # the last valid token is the <eos> after the text
    assert scores[0, 6] == 1.0 and scores[1, 6] == pytest.approx(5 / 6)
    assert scores[2, 2] == 0.25
    assert scores.sum().item() == pytest.approx(1.0 + 5 / 6 + 0.25)
    metrics = out.meta_info["metrics"]
    assert metrics["reward/errors"] == 0 and metrics["reward/timeouts"] == 0
    assert metrics["reward/length/mean"] == 2.0
    assert out.non_tensor_batch["reward_extra_info"][2]["length"] == 2.0
    assert out.meta_info["reward_errors"] == []
    merged = batch.union(out)
    assert "token_level_scores" in merged.batch


def test_raising_and_hanging_functions_score_zero_and_are_reported(
    manager: RewardManager,
    tokenizer,
    caplog: pytest.LogCaptureFixture,  # type: ignore[no-untyped-def]
) -> None:
    batch = make_batch(
        tokenizer,
        [
            ("123456", "sort_digits", "123456"),
            ("bad answer", "raise", "x"),
            ("slow answer", "hang", "x"),
            ("132", "sort_digits", "123"),
        ],
    )
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hf_algos.rewards.manager"):
        out = manager.score(batch)
    assert time.monotonic() - start < 20  # the 60 s sleep was cut at 1 s
    per_sample = out.batch["token_level_scores"].sum(dim=1).tolist()
    assert per_sample == [1.0, 0.0, 0.0, pytest.approx(1 / 3)]
    metrics = out.meta_info["metrics"]
    assert metrics["reward/errors"] == 2 and metrics["reward/timeouts"] == 1
    reports = {r["data_source"]: r for r in out.meta_info["reward_errors"]}
    assert reports["raise"]["status"] == "error" and reports["raise"]["index"] == 1
    assert "ValueError: cannot parse 'bad answer'" in reports["raise"]["error"]
    assert reports["raise"]["response"] == "bad answer"
    assert reports["hang"]["status"] == "timeout" and reports["hang"]["response"] == "slow answer"
    assert "'bad answer'" in caplog.text and "data_source 'hang'" in caplog.text
    info = out.non_tensor_batch["reward_extra_info"]
    assert [i["status"] for i in info] == ["ok", "error", "timeout", "ok"]


def test_stuck_workers_are_replaced(manager: RewardManager, tokenizer) -> None:  # type: ignore[no-untyped-def]
    manager.score(make_batch(tokenizer, [("1", "sort_digits", "1")]))  # pool is up
    manager.config = dataclasses.replace(manager.config, hard_timeout_grace_s=3.0)
    try:
        batch = make_batch(tokenizer, [("123", "sort_digits", "123"), ("x", "block", "x")])
        start = time.monotonic()
        out = manager.score(batch)
        assert time.monotonic() - start < 30
        statuses = [i["status"] for i in out.non_tensor_batch["reward_extra_info"]]
        assert statuses == ["ok", "timeout"]
        assert out.meta_info["metrics"]["reward/errors"] == 1
        assert all("hard deadline" in r["error"] for r in out.meta_info["reward_errors"])
    finally:
        manager.config = dataclasses.replace(manager.config, hard_timeout_grace_s=60.0)
    # The pool was replaced: the next batch is scored normally.
    again = manager.score(make_batch(tokenizer, [("12", "sort_digits", "12")]))
    assert again.batch["token_level_scores"].sum().item() == 1.0


def test_a_dead_worker_is_an_error_at_once_with_its_exit_code(
    manager: RewardManager,
    tokenizer,  # type: ignore[no-untyped-def]
) -> None:
    batch = make_batch(tokenizer, [("123", "sort_digits", "123"), ("y", "exit", "y")])
    # A deadline far beyond anything a loaded machine takes to start a process and import
    # the scoring function (~6 s quiet, ~20 s at load 10): the error must not wait for it.
    manager.config = dataclasses.replace(manager.config, hard_timeout_grace_s=600.0)
    start = time.monotonic()
    try:
        with pytest.raises(
            RewardError, match=r"died while scoring data_source\(s\) .*'exit'.*code 3"
        ):
            manager.score(batch)
    finally:
        manager.config = dataclasses.replace(manager.config, hard_timeout_grace_s=60.0)
    assert time.monotonic() - start < 120  # at once: not at the >= 600 s hard deadline
    again = manager.score(make_batch(tokenizer, [("12", "sort_digits", "12")]))
    assert again.batch["token_level_scores"].sum().item() == 1.0


def test_score_async_does_not_block_the_driver(manager: RewardManager, tokenizer) -> None:  # type: ignore[no-untyped-def]
    slow = make_batch(tokenizer, [("slow", "hang", "x"), ("21", "sort_digits", "12")])
    fast = make_batch(tokenizer, [("12", "sort_digits", "12")])
    start = time.monotonic()
    first = manager.score_async(slow)
    second = manager.score_async(fast)
    assert time.monotonic() - start < 0.5 and not first.done()
    driver_work = sum(i * i for i in range(10_000))  # the driver keeps going meanwhile
    assert driver_work > 0
    assert second.result(timeout=60).batch["token_level_scores"].sum().item() == 1.0
    assert first.done()  # batches are scored in submission order
    out = first.result()
    assert out.meta_info["metrics"]["reward/timeouts"] == 1


def test_configuration_errors_are_raised_not_scored(tokenizer) -> None:  # type: ignore[no-untyped-def]
    registry = _registry()
    with RewardManager(tokenizer, RewardSection(num_workers=1), registry) as manager:
        with pytest.raises(KeyError, match="no scoring function for data_source 'nope'"):
            manager.score(make_batch(tokenizer, [("a", "nope", "a")]))
        registry["locked"] = functools.partial(locked_score, lock=threading.Lock())
        with pytest.raises(TypeError, match=r"'locked'.*cannot be pickled"):
            manager.score(make_batch(tokenizer, [("a", "locked", "a")]))
        registry["positional"] = lambda s, g, e: 1.0  # placed without registration
        with pytest.raises(TypeError, match=r"'positional'.*required parameter 's' names no"):
            manager.score(make_batch(tokenizer, [("a", "positional", "a")]))
        batch = make_batch(tokenizer, [("1", "sort_digits", "1")])
        batch.non_tensor_batch["reward_model"][0] = {"answer": "a"}
        with pytest.raises(ConfigurationError, match=r"row 0 .* has no reward_model.ground_truth"):
            manager.score(batch)
    with pytest.raises(ValueError, match="num_workers"):
        RewardSection(num_workers=0)


CLOSE_BESIDE_A_CHILD = """
import multiprocessing, sys, time
from hf_algos.rewards.pool import ScoringPool

if __name__ == "__main__":
    pool = ScoringPool("spawn", 1, None)
    pool.start_processes()  # the pool starts multiprocessing's resource tracker
    # Started after the pool's helpers, like vLLM's engine beside the local backend's reward
    # pool: a spawned child gets a copy of the resource tracker's pipe.
    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    child.start()
    start = time.perf_counter()
    pool.close()
    print(f"closed in {time.perf_counter() - start:.1f} s", flush=True)
    child.terminate()
    child.join()
"""


def test_pool_closes_while_another_child_process_shares_its_helpers(tmp_path: Any) -> None:
    """Closing the pool must not wait for helpers that another child process keeps alive
    (it used to wait forever: the local backend's driver with a vLLM engine)."""
    import subprocess
    import sys

    script = tmp_path / "close.py"
    script.write_text(CLOSE_BESIDE_A_CHILD)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "closed in" in done.stdout
    assert float(done.stdout.split("closed in ")[1].split()[0]) < 15.0


def pid_score(solution: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """Scores 1 and says which process scored it."""
    return {"score": 1.0, "pid": float(os.getpid())}


def _task(fn: Any) -> Any:
    """A one-sample scoring task of ``fn`` (1 s alarm, no CPU-time limit)."""
    import cloudpickle

    from hf_algos.rewards.registry import scoring_call_of
    from hf_algos.rewards.scoring_worker import ScoringTask

    sample = {"solution": "x", "ground_truth": "x", "data_source": "t", "extra_info": None}
    blob = cloudpickle.dumps(scoring_call_of(fn))
    return ScoringTask(function=blob, samples=[sample], timeout_s=1.0, cpu_limit_per_sample_s=None)


def test_a_task_past_its_deadline_loses_its_process_not_the_pool() -> None:
    """A task that ignores the alarm is stopped at its own deadline: the pool kills its
    process, starts another, and scores the next task (pebble's per-task timeout)."""
    from hf_algos.rewards.pool import ScoringPool

    pool = ScoringPool("forkserver", 1, None)
    try:
        # the first call imports this module in the worker; then the process is known
        first = pool.submit(_task(pid_score), 300.0).result(timeout=300)[0]
        assert first.status == "ok"
        stuck = pool.submit(_task(alarm_blocking_score), 3.0)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            stuck.result(timeout=120)
        assert time.monotonic() - start < 30  # the task's deadline, not the alarm's 60 s sleep
        assert not pool.broken
        again = pool.submit(_task(pid_score), 300.0).result(timeout=300)[0]
        assert again.score == 1.0 and again.extras["pid"] != first.extras["pid"]
        assert not os.path.exists(f"/proc/{int(first.extras['pid'])}")  # killed and reaped
    finally:
        pool.close(kill=True)
