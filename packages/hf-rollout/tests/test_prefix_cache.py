"""Prefix reuse of the native engine: multi-turn turns prefill only their new tokens, and
the samples and log-probs equal those of prefilling the whole conversation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hf_protocol import DataProto
from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.backends.steppers import transformers_can_reuse
from hf_rollout.multiturn import AgentLoopConfig, StepResult, run_agent_loop
from hf_rollout.testing import make_prompts, tiny_model_config

PAD = 0
STOPS = tuple(range(100, 112))
"""Stop ids: a sampled row stops on one about every tenth token, so rows end unevenly."""


class AsciiCodec:
    """One token per character (the tiny models have a 128-id vocabulary)."""

    def encode(self, text: str) -> list[int]:
        return [ord(char) % 128 for char in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)


class UnevenEnvironment:
    """Replies of different lengths per prompt and turn; done after ``turns`` turns.

    The width comes from the prompt, not from a construction counter: the loop builds
    environments on worker threads, so construction order is not fixed."""

    def __init__(self, turns: int = 4) -> None:
        self.turns, self.seen, self.width = turns, 0, 1

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        self.seen, self.width = 0, len(prompt) % 4 + 1

    def step(self, model_text: str) -> StepResult:
        self.seen += 1
        reply = "<" + "r" * (self.width + self.seen) + ">"
        return StepResult(reply, done=self.seen >= self.turns)


def native(model: Path, rows: int, **engine_kwargs: Any) -> NativeRollout:
    config = RolloutConfig(
        model_path=str(model), pad_token_id=PAD, prefix_cache_rows=rows, engine_kwargs=engine_kwargs
    )
    return NativeRollout(config)


def episodes(engine: NativeRollout, sampling: SamplingConfig) -> DataProto:
    prompts = make_prompts([AsciiCodec().encode(t) for t in ["Hi!", "2+2=", "a longer prompt"]])
    config = AgentLoopConfig(max_turns=4, max_response_tokens=60)
    return run_agent_loop(engine, prompts, UnevenEnvironment, AsciiCodec(), sampling, config)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers"])
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_multi_turn_reuse_equals_full_prefill(
    tiny_models: dict[str, Path], lean: bool, greedy: bool
) -> None:
    sampling = SamplingConfig(n=2, greedy=greedy, max_new_tokens=8, stop_token_ids=STOPS, seed=3)
    reused = native(tiny_models["llama"], 64, lean_forward=lean)
    full = native(tiny_models["llama"], 0, lean_forward=lean)
    assert reused.prefix_cache is not None and full.prefix_cache is None
    out, expected = episodes(reused, sampling), episodes(full, sampling)
    assert torch.equal(out.batch["responses"], expected.batch["responses"])
    assert torch.equal(out.batch["response_mask"], expected.batch["response_mask"])
    # fp32: a suffix prefilled over stored keys and values rounds differently than a
    # whole-sequence prefill, by far less than this.
    torch.testing.assert_close(
        out.batch["rollout_log_probs"], expected.batch["rollout_log_probs"], atol=1e-5, rtol=0
    )
    cache = reused.prefix_cache
    # Every turn after the first reused all of the conversation but its newest tokens.
    assert cache.hit_tokens > 0.6 * cache.prompt_tokens
    # One entry per conversation (its latest turn); greedy twins of a prompt are one.
    assert len(cache) == (3 if greedy else 6) and cache.nbytes > 0


def raw_prompts(token_lists: list[list[int]]) -> DataProto:
    array = np.empty(len(token_lists), dtype=object)
    array[:] = token_lists
    return DataProto.from_dict(non_tensors={"raw_prompt_ids": array})


def test_one_call_mixes_full_partial_and_no_hits(tiny_models: dict[str, Path]) -> None:
    sampling = SamplingConfig(n=2, max_new_tokens=6, stop_token_ids=STOPS, seed=5)
    reused = native(tiny_models["qwen3"], 64)
    cache = reused.prefix_cache
    assert cache is not None
    first = reused.generate(raw_prompts([[5, 6, 7], [9, 10, 11, 12, 13]]), sampling)
    rows = [
        [5, 6, 7, *first.batch["responses"][0][first.batch["response_mask"][0].bool()].tolist()],
        [9, 10, 11, 12, 13, *first.batch["responses"][2][:2].tolist()],
    ]
    second = [
        [*rows[0], 40, 41, 42],  # the whole of a kept sequence and a reply
        [70, 71, 72, 73, 74, 75, 76, 77],  # no hit: prefilled whole in the same call
        [*rows[1][:6], 50],  # shares 6 tokens with a kept sequence, then differs
    ]
    before = cache.hit_tokens
    out = reused.generate(raw_prompts(second), sampling)
    expected = native(tiny_models["qwen3"], 0).generate(raw_prompts(second), sampling)
    assert cache.hit_tokens - before == len(rows[0]) - 1 + 6
    assert torch.equal(out.batch["responses"], expected.batch["responses"])
    torch.testing.assert_close(
        out.batch["rollout_log_probs"], expected.batch["rollout_log_probs"], atol=1e-5, rtol=0
    )
    # A turn with an empty reply: every row feeds one token (its last sampled one).
    mask = out.batch["response_mask"].bool()
    again = [
        [*second[row // 2], *out.batch["responses"][row][mask[row]].tolist()] for row in (0, 3)
    ]
    before = cache.hit_tokens
    out = reused.generate(raw_prompts(again), sampling)
    assert cache.hit_tokens - before == sum(map(len, again)) - 2
    expected = native(tiny_models["qwen3"], 0).generate(raw_prompts(again), sampling)
    assert torch.equal(out.batch["responses"], expected.batch["responses"])


def test_weight_update_and_sleep_drop_the_cache(tiny_models: dict[str, Path]) -> None:
    sampling = SamplingConfig(greedy=True, max_new_tokens=6)
    engine = native(tiny_models["qwen2"], 64)
    cache = engine.prefix_cache
    assert cache is not None
    first = engine.generate(raw_prompts([[3, 4, 5, 6]]), sampling)
    assert len(cache) == 1
    follow_up = raw_prompts([[3, 4, 5, 6, *first.batch["responses"][0].tolist(), 20, 21]])
    other = AutoModelForCausalLM.from_pretrained(tiny_models["qwen2_other"])
    engine.update_weights(other.state_dict().items())
    assert len(cache) == 0
    # Kept keys and values of the old weights would change these samples.
    out = engine.generate(follow_up, sampling)
    expected = native(tiny_models["qwen2_other"], 0).generate(follow_up, sampling)
    assert torch.equal(out.batch["responses"], expected.batch["responses"])
    torch.testing.assert_close(
        out.batch["rollout_log_probs"], expected.batch["rollout_log_probs"], atol=1e-5, rtol=0
    )
    assert len(cache) == 1
    engine.sleep()
    assert len(cache) == 0 and cache.nbytes == 0
    engine.wake_up()


def test_cache_is_bounded_and_off_where_layers_are_not_full_attention(
    tiny_models: dict[str, Path],
) -> None:
    engine = native(tiny_models["llama"], 3)
    engine.generate(raw_prompts([[1, 2], [3, 4], [5, 6]]), SamplingConfig(n=2, max_new_tokens=3))
    assert engine.prefix_cache is not None and len(engine.prefix_cache) == 3
    windowed = AutoConfig.for_model(
        **tiny_model_config("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    )
    assert not transformers_can_reuse(windowed)
    assert transformers_can_reuse(AutoConfig.for_model(**tiny_model_config("qwen2")))


def test_prompts_at_custom_positions_are_prefilled_whole(tiny_models: dict[str, Path]) -> None:
    prompts = make_prompts([[3, 4, 5, 6], [7, 8]], PAD)
    assert prompts.batch is not None
    prompts.batch["position_ids"] = prompts.batch["position_ids"] + 5
    sampling = SamplingConfig(greedy=True, max_new_tokens=4)
    engine = native(tiny_models["llama"], 8)
    out = engine.generate(prompts, sampling)
    # Keys kept at shifted positions would not fit a prompt counted from 0: none are kept.
    assert engine.prefix_cache is not None and len(engine.prefix_cache) == 0
    expected = native(tiny_models["llama"], 0).generate(prompts, sampling)
    assert torch.equal(out.batch["responses"], expected.batch["responses"])
