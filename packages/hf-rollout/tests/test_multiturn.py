"""Multi-turn rollouts: the calculator tool, and the agent loop on a tiny local model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.multiturn import (
    AgentLoopConfig,
    CalculatorEnvironment,
    Environment,
    EnvironmentSpecError,
    StepResult,
    environment_factory,
    evaluate_arithmetic,
    run_agent_loop,
    tool_schemas,
)
from hf_rollout.testing import make_prompts

PAD = 0


class AsciiCodec:
    """One token per character (the tiny models have a 128-id vocabulary)."""

    def encode(self, text: str) -> list[int]:
        return [ord(char) % 128 for char in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)


class CountingEnvironment:
    """Replies ``#k`` to the k-th model turn and ends the episode after ``turns`` turns."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.seen: list[str] = []
        self.prompt = ""

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        self.prompt, self.seen = prompt, []

    def step(self, model_text: str) -> StepResult:
        self.seen.append(model_text)
        return StepResult(f"#{len(self.seen)}", reward=0.5, done=len(self.seen) >= self.turns)


def test_calculator_evaluates_safely() -> None:
    assert evaluate_arithmetic("2 + 3 * (4 - 1)") == 11
    assert evaluate_arithmetic("-7 // 2") == -4
    with pytest.raises(ValueError, match="unsupported element Call"):
        evaluate_arithmetic("__import__('os')")
    with pytest.raises(ValueError, match="unsupported operator Pow"):
        evaluate_arithmetic("9 ** 9 ** 9")


def test_calculator_environment_replies_and_ends() -> None:
    env = CalculatorEnvironment()
    assert isinstance(env, Environment)
    env.reset("What is 12 * 7?", {})
    assert env.step("let me compute <calc>12 * 7</calc>") == StepResult(
        "<result>84</result>", tool_calls=1
    )
    assert env.step("<calc>1/0</calc>") == StepResult(
        "<error>division by zero</error>", tool_calls=1
    )
    assert env.step("<calc>8 / 4</calc>") == StepResult("<result>2</result>", tool_calls=1)
    assert env.step("<calc>8 / 4") == StepResult(
        "<error>unclosed <calc> call: end it with </calc></error>", tool_calls=1
    )
    assert env.step("The answer is 84.") == StepResult(done=True)


def engine(model: Path) -> NativeRollout:
    return NativeRollout(RolloutConfig(model_path=str(model), pad_token_id=PAD))


def test_agent_loop_masks_tool_tokens_and_keeps_log_probs(
    tiny_models: dict[str, Path], hf: Any
) -> None:
    prompts = make_prompts([AsciiCodec().encode("Hi!"), AsciiCodec().encode("2+2=")], PAD)
    envs: list[CountingEnvironment] = []

    def make_env() -> CountingEnvironment:
        envs.append(CountingEnvironment(turns=3))
        return envs[-1]

    # a seed whose draws end no turn early (each row's stream follows its index)
    sampling = SamplingConfig(n=2, temperature=0.9, max_new_tokens=4, seed=1)
    config = AgentLoopConfig(max_turns=5, max_response_tokens=40)
    rollout = engine(tiny_models["llama"])
    out = run_agent_loop(rollout, prompts, make_env, AsciiCodec(), sampling, config)
    assert len(out) == 4 and out.non_tensor_batch["num_turns"].tolist() == [3, 3, 3, 3]
    assert [env.prompt for env in envs] == ["Hi!", "Hi!", "2+2=", "2+2="]
    assert out.non_tensor_batch["env_reward"].tolist() == [1.5] * 4
    assert out.non_tensor_batch["tool_calls"].tolist() == [0] * 4
    assert out.non_tensor_batch["env_error"].tolist() == [""] * 4
    for row in range(4):
        tokens = out.batch["responses"][row].tolist()
        mask = out.batch["response_mask"][row].tolist()
        # 4 model tokens, "#1", 4 model tokens, "#2", 4 model tokens; no reply after "done".
        assert mask == [1] * 4 + [0] * 2 + [1] * 4 + [0] * 2 + [1] * 4
        assert AsciiCodec().decode(tokens[4:6] + tokens[10:12]) == "#1#2"
        assert envs[row].seen[1] == AsciiCodec().decode(tokens[6:10])
    # Model tokens' log-probs are those of a forward pass over the whole conversation.
    expected = hf.log_probs(tiny_models["llama"], out, temperature=0.9)
    model_tokens = out.batch["response_mask"].bool()
    torch.testing.assert_close(
        out.batch["rollout_log_probs"][model_tokens], expected[model_tokens], atol=1e-5, rtol=0
    )
    assert (out.batch["rollout_log_probs"][~model_tokens] == 0).all()


def test_agent_loop_limits(tiny_models: dict[str, Path]) -> None:
    prompts = make_prompts([AsciiCodec().encode("abc")], PAD)
    sampling = SamplingConfig(max_new_tokens=4, seed=1)
    rollout = engine(tiny_models["qwen2"])

    def forever() -> CountingEnvironment:
        return CountingEnvironment(turns=100)

    by_turns = run_agent_loop(
        rollout, prompts, forever, AsciiCodec(), sampling, AgentLoopConfig(max_turns=2)
    )
    assert by_turns.non_tensor_batch["num_turns"].tolist() == [2]
    assert by_turns.batch["response_mask"].sum() == 8
    by_tokens = run_agent_loop(
        rollout, prompts, forever, AsciiCodec(), sampling, AgentLoopConfig(max_response_tokens=7)
    )
    assert by_tokens.batch["attention_mask"][0, 3:].sum() == 7  # 4 model + "#1" + 1 model
    assert by_tokens.batch["response_mask"].sum() == 5


def test_agent_loop_with_the_calculator_ends_on_an_answer(tiny_models: dict[str, Path]) -> None:
    prompts = make_prompts([AsciiCodec().encode("3*4=")], PAD)
    out = run_agent_loop(
        engine(tiny_models["qwen2"]),
        prompts,
        CalculatorEnvironment,
        AsciiCodec(),
        SamplingConfig(greedy=True, max_new_tokens=6),
        AgentLoopConfig(max_turns=3),
    )
    # A random model writes no <calc> call, so its first turn is its final answer.
    assert out.non_tensor_batch["num_turns"].tolist() == [1]
    assert out.batch["response_mask"].sum() == 6


def test_environment_factory_loads_registered_and_file_environments(tmp_path: Path) -> None:
    assert isinstance(environment_factory("calculator")(), CalculatorEnvironment)
    tools = environment_factory("tools", tools=["calc"])()
    assert tools.step("<calc>2*3</calc>") == StepResult("<result>6</result>", tool_calls=1)
    source = tmp_path / "my_env.py"
    source.write_text(
        "from hf_rollout.multiturn import StepResult\n"
        "class Echo:\n"
        "    def reset(self, prompt, info):\n"
        "        self.answer = info.get('ground_truth')\n"
        "    def step(self, text):\n"
        "        return StepResult(done=True, reward=float(text == self.answer))\n"
    )
    echo = environment_factory(f"{source}:Echo")()
    echo.reset("q", {"ground_truth": "42"})
    assert echo.step("42") == StepResult(reward=1.0, done=True)
    with pytest.raises(EnvironmentSpecError, match=r"unknown environment 'nope'.*calculator"):
        environment_factory("nope")
    with pytest.raises(EnvironmentSpecError, match="has no class 'Missing'"):
        environment_factory(f"{source}:Missing")
    with pytest.raises(EnvironmentSpecError, match="cannot be built with arguments"):
        environment_factory("calculator", tools=["calc"])
    with pytest.raises(ValueError, match=r"unknown tools \['shell'\]"):
        environment_factory("tools", tools=["shell"])
    assert tool_schemas(["calc"])[0]["function"]["name"] == "calc"
