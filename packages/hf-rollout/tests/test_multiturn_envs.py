"""Environments as plug-ins: the sandboxed python tool (real child processes), concurrent
environment steps, environments that fail, and the multi-turn metrics."""

from __future__ import annotations

import gc
import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hf_controller.testing import descendant_pids
from hf_protocol import DataProto
from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.multiturn import (
    AgentLoopConfig,
    PythonEnvironment,
    PythonSandbox,
    StepResult,
    ToolEnvironment,
    ToolError,
    environment_factory,
    multi_turn_metrics,
    run_agent_loop,
)
from hf_rollout.multiturn.parallel import call_concurrently
from hf_rollout.testing import make_prompts

from .test_multiturn import PAD, AsciiCodec


class SpellingCodec(AsciiCodec):
    """ASCII, except that each model token decodes to ``chunk``: the random tiny model's
    turns then spell tool calls (``chunk`` repeated), as a tool-using policy's would."""

    def __init__(self, chunk: str) -> None:
        self.chunk = chunk

    def decode(self, ids: Sequence[int]) -> str:
        return self.chunk * len(ids)


@pytest.fixture(scope="module")
def rollout(tiny_models: dict[str, Path]) -> NativeRollout:
    return NativeRollout(RolloutConfig(model_path=str(tiny_models["qwen2"]), pad_token_id=PAD))


@pytest.fixture(scope="module")
def sandbox() -> Iterator[PythonSandbox]:
    # A wall-clock timeout far above the CPU-time limit (whole seconds, rounded up), so that
    # a busy machine cannot make the one stand in for the other.
    with PythonSandbox(max_workers=2, timeout_s=10.0, cpu_time_limit_s=1.0) as box:
        yield box


def prompts_of(*texts: str) -> DataProto:
    return make_prompts([AsciiCodec().encode(text) for text in texts], PAD)


def test_python_sandbox_evaluates_and_refuses(sandbox: PythonSandbox) -> None:
    assert sandbox.run("sorted([3,1,2])[0] + len('abc')") == "4"
    assert sandbox.run("math.sqrt(16), 'ab' * 2") == "(4.0, 'abab')"
    assert sandbox.run("'x' * 600") == "x" * 512 + "...[88 more chars]"
    refused = {
        "__import__('os')": "name '__import__' is not allowed",
        "open('/etc/passwd')": "NameError: name 'open' is not defined",
        "exec('1')": "NameError: name 'exec' is not defined",
        "().__class__.__bases__": "attribute '__bases__' is not allowed",
        "'{0.__class__}'.format(1)": "attribute 'format' is not allowed",
        "(x for x in []).gi_frame": "attribute 'gi_frame' is not allowed",
        "import os": "SyntaxError",
        "1 / 0": "ZeroDivisionError: division by zero",
        "[0] * 10**9": "MemoryError",  # 8 GB of list against the 256 MB address space
        # A Python-level loop: SIGXCPU interrupts it, and the child stays usable.
        "sum(i * i for i in range(10**10))": "CPU-time limit of 1.0 s exceeded",
    }
    for expression, why in refused.items():
        with pytest.raises(ToolError, match=why.replace("(", r"\(").replace(")", r"\)")):
            sandbox.run(expression)
    assert sandbox.run("1 + 1") == "2"
    # A loop inside C code cannot be interrupted: the wall clock kills and replaces the child.
    with PythonSandbox(max_workers=1, timeout_s=1.0, cpu_time_limit_s=30.0) as box:
        with pytest.raises(ToolError, match=r"timed out after 1.0 s"):
            box.run("sum(range(10**13))")
        assert box.run("1 + 1") == "2"


def test_python_sandbox_reuses_its_processes_and_leaves_none() -> None:
    before = descendant_pids()
    box = PythonSandbox(max_workers=3)
    start = time.perf_counter()
    assert box.run("2 ** 10") == "1024"
    cold = time.perf_counter() - start
    children = descendant_pids() - before
    assert len(children) == 1
    start = time.perf_counter()
    for _ in range(20):
        box.run("sum(range(100))")
    warm = (time.perf_counter() - start) / 20
    assert descendant_pids() - before == children  # reused, not restarted
    # A child started for a short-lived thread (as the loop's step threads are) outlives it.
    box.close()
    box = PythonSandbox(max_workers=1)
    thread = threading.Thread(target=box.run, args=("1",))
    thread.start()
    thread.join()
    children = descendant_pids() - before
    assert box.run("2") == "2" and descendant_pids() - before == children
    assert warm < cold  # measured: ~30 ms to start a child, ~0.2 ms a warm call
    with ThreadPoolExecutor(8) as pool:
        values = list(pool.map(box.run, [f"{i} * 3" for i in range(24)]))
    assert values == [str(i * 3) for i in range(24)]
    assert 1 <= len(descendant_pids() - before) <= 3
    box.close()
    assert descendant_pids() - before == set()
    with pytest.raises(ToolError, match="closed"):
        box.run("1")
    dropped = PythonSandbox()
    dropped.run("1")
    del dropped
    gc.collect()
    assert descendant_pids() - before == set()  # the finalizer ended it


def test_python_tool_through_the_registry() -> None:
    env = environment_factory("tools", tools=["calc", "python"])()
    env.reset("q", {})
    assert env.step("<python>len('hello')</python>") == StepResult(
        "<result>5</result>", tool_calls=1
    )
    assert env.step("<calc>2*3</calc>") == StepResult("<result>6</result>", tool_calls=1)
    assert env.step("<python>__import__('os')</python>") == StepResult(
        "<error>ValueError: name '__import__' is not allowed</error>", tool_calls=1
    )
    assert isinstance(environment_factory("python")(), PythonEnvironment)


def test_tool_calls_through_the_loop(rollout: NativeRollout) -> None:
    sampling = SamplingConfig(greedy=True, max_new_tokens=2)
    config = AgentLoopConfig(max_turns=2, max_response_tokens=200)
    python = SpellingCodec("<python>4*4</python>")
    out = run_agent_loop(
        rollout, prompts_of("a", "bc"), PythonEnvironment, python, sampling, config
    )
    reply = "<result>16</result>"
    for row in range(2):
        mask = out.batch["response_mask"][row].tolist()
        # The reply to the last turn is appended too (the episode is cut, not done).
        assert mask == ([1, 1] + [0] * len(reply)) * 2
        observation = out.batch["responses"][row][2 : 2 + len(reply)].tolist()
        assert AsciiCodec().decode(observation) == reply
    assert out.non_tensor_batch["tool_calls"].tolist() == [2, 2]
    # A call the model does not close gets an error reply, and the episode goes on.
    unclosed = SpellingCodec("<calc>1+")
    capped = AgentLoopConfig(max_turns=2, max_tool_response_tokens=12)
    out = run_agent_loop(rollout, prompts_of("a"), ToolEnvironment, unclosed, sampling, capped)
    assert AsciiCodec().decode(out.batch["responses"][0][2:14].tolist()) == "<error>unclo"
    assert out.non_tensor_batch["num_turns"].tolist() == [2]
    assert out.non_tensor_batch["env_error"].tolist() == [""]


class SleepyEnvironment:
    """Each step sleeps ``SLEEP_S`` (a slow tool) and records when it ran."""

    SLEEP_S = 0.3
    spans: list[tuple[float, float]] = []

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        pass

    def step(self, model_text: str) -> StepResult:
        start = time.monotonic()
        time.sleep(self.SLEEP_S)
        self.spans.append((start, time.monotonic()))
        return StepResult(done=True)


def test_episodes_step_concurrently(rollout: NativeRollout) -> None:
    SleepyEnvironment.spans.clear()
    sampling = SamplingConfig(n=2, max_new_tokens=2, seed=0)
    prompts = prompts_of("a", "b", "c", "d")
    config = AgentLoopConfig(max_turns=1, concurrency=8)
    out = run_agent_loop(rollout, prompts, SleepyEnvironment, AsciiCodec(), sampling, config)
    assert len(out) == 8 and len(SleepyEnvironment.spans) == 8
    turn = max(end for _, end in SleepyEnvironment.spans) - min(
        s for s, _ in SleepyEnvironment.spans
    )
    assert turn < 1.5, f"8 steps of 0.3 s took {turn:.2f} s: they ran one after another"


class FragileEnvironment:
    """Behaves as its prompt says: ``ok``, ``reset`` (raises there), ``raise``, ``hang``
    (until released), ``junk`` (answers a string) or ``nan`` (a NaN reward)."""

    release = threading.Event()

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        self.mode = prompt
        if prompt == "reset":
            raise RuntimeError("no such task")

    def step(self, model_text: str) -> Any:
        if self.mode == "raise":
            raise ValueError("cannot parse the answer")
        if self.mode == "hang":
            self.release.wait(30)
        if self.mode == "junk":
            return "done"
        reward = math.nan if self.mode == "nan" else 1.0
        return StepResult("ok", reward=reward, done=self.mode == "ok")


def test_failing_environments_end_only_their_episode(rollout: NativeRollout) -> None:
    modes = ["ok", "reset", "raise", "hang", "junk", "nan", "ok"]
    config = AgentLoopConfig(max_turns=3, step_timeout_s=0.5, concurrency=4)
    sampling = SamplingConfig(max_new_tokens=2, seed=0)
    start = time.monotonic()
    try:
        out = run_agent_loop(
            rollout, prompts_of(*modes), FragileEnvironment, AsciiCodec(), sampling, config
        )
    finally:
        FragileEnvironment.release.set()  # let the abandoned thread finish
    assert time.monotonic() - start < 10
    assert len(out) == len(modes)  # no row skipped
    errors = out.non_tensor_batch["env_error"].tolist()
    expected = {
        1: "FragileEnvironment.reset failed on row 1, turn 0: RuntimeError: no such task",
        2: "FragileEnvironment.step failed on row 2, turn 1: ValueError: cannot parse",
        3: "FragileEnvironment.step failed on row 3, turn 1: timed out after 0.5 s",
        4: "FragileEnvironment.step failed on row 4, turn 1: returned str, expected StepResult",
        5: "FragileEnvironment.step failed on row 5, turn 1: returned reward nan",
    }
    for row, error in enumerate(errors):
        assert error.startswith(expected.get(row, "")) and bool(error) == (row in expected)
    assert out.non_tensor_batch["num_turns"].tolist() == [1, 0, 1, 1, 1, 1, 1]
    assert out.batch["response_mask"].sum(dim=1).tolist() == [2, 0, 2, 2, 2, 2, 2]
    metrics = multi_turn_metrics(out)
    assert metrics["multi_turn/env_errors"] == 5
    assert metrics["multi_turn/env_reward/mean"] == pytest.approx(2 / 7)


def test_multi_turn_metrics() -> None:
    columns = {
        "num_turns": [1, 3, 2, 2],
        "tool_calls": [0, 2, 1, 0],
        "env_reward": [0.0, 1.0, 0.5, 0.5],
        "env_error": ["", "", "Env.step failed on row 2, turn 2: ValueError: x", ""],
    }
    out = DataProto.from_dict(non_tensors={k: np.array(v) for k, v in columns.items()})
    assert multi_turn_metrics(out) == {
        "multi_turn/num_turns/mean": 2.0,
        "multi_turn/num_turns/max": 3.0,
        "multi_turn/tool_calls/mean": 0.75,
        "multi_turn/tool_call_rate": 0.5,
        "multi_turn/env_errors": 1.0,
        "multi_turn/env_reward/mean": 0.5,
        "multi_turn/env_tokens/mean": 0.0,  # no response tensors in this batch
    }
    with pytest.raises(KeyError, match=r"needs the columns \['num_turns'"):
        multi_turn_metrics(DataProto.from_dict(non_tensors={"x": np.array(columns["env_error"])}))


def test_hung_calls_are_abandoned_and_replaced() -> None:
    release = threading.Event()
    hang = release.wait
    calls = [lambda: 1, lambda: 1 / 0, lambda: hang(30), lambda: 2, lambda: hang(30), lambda: 3]
    start = time.monotonic()
    try:
        outcomes = call_concurrently(calls, concurrency=2, timeout_s=0.3)
    finally:
        release.set()
    # Two hangs on two threads: each is abandoned after 0.3 s and a new thread goes on.
    assert time.monotonic() - start < 2.0
    assert [o.value for o in outcomes] == [1, None, None, 2, None, 3]
    assert isinstance(outcomes[1].error, ZeroDivisionError)
    assert [o.timed_out for o in outcomes] == [False, False, True, False, True, False]
