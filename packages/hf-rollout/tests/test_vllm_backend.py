"""The vLLM backend checked against transformers on tiny local models (CPU build, fp32).

Skipped unless vLLM is installed (``bash tools/setup_vllm_env.sh`` makes a venv with the CPU
build). One engine serves the whole module: starting one takes tens of seconds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hf_protocol import DataProto
from hf_rollout import RolloutConfig, SamplingConfig, build_rollout
from hf_rollout.backends.native import NativeRollout
from hf_rollout.multiturn import AgentLoopConfig, StepResult, run_agent_loop
from hf_rollout.testing import make_prompts, random_prompt_ids

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PAD = 0


@pytest.fixture(scope="module")
def engine(wide_head_models: dict[str, Path]) -> Iterator[Any]:
    """One vLLM engine on model ``a`` for the module."""
    rollout = build_rollout(
        RolloutConfig(
            backend="vllm",
            model_path=str(wide_head_models["a"]),
            pad_token_id=PAD,
            max_model_len=128,
            engine_kwargs={"kv_cache_space_gib": 1},
        )
    )
    yield rollout
    rollout.shutdown()


def check_greedy(engine: Any, hf: Any, path: Path, prompts: DataProto) -> None:
    """Greedy output equals transformers', and the eos ends some rows but not all."""
    out, eos = hf.check_greedy(engine, path, prompts)
    finished = (out.batch["responses"] == eos).any(dim=1)
    assert finished.any() and not finished.all()


def test_greedy_equals_transformers_generate(
    engine: Any, hf: Any, wide_head_models: dict[str, Path]
) -> None:
    prompts = make_prompts(random_prompt_ids(12, seed=1), PAD)
    check_greedy(engine, hf, wide_head_models["a"], prompts)


def test_sampled_log_probs_match_transformers_forward(
    engine: Any, hf: Any, wide_head_models: dict[str, Path]
) -> None:
    """rollout_log_probs = log_softmax(logits / T) of a transformers forward (fp32)."""
    prompts = make_prompts(random_prompt_ids(6, seed=2), PAD)
    prompts.non_tensor_batch["uid"] = np.array([f"p{i}" for i in range(6)], dtype=object)
    sampling = SamplingConfig(n=3, temperature=0.7, max_new_tokens=8, seed=11)
    out = engine.generate(prompts, sampling)

    rows = 6 * 3
    assert out.batch["responses"].shape[0] == rows
    assert list(out.non_tensor_batch["uid"]) == [f"p{i}" for i in range(6) for _ in range(3)]
    assert out.meta_info["temperature"] == pytest.approx(0.7)
    width = out.batch["prompts"].shape[1]
    mask = out.batch["response_mask"]
    assert torch.equal(out.batch["input_ids"][:, width:], out.batch["responses"])
    assert torch.equal(out.batch["attention_mask"][:, width:], mask)
    # Sampling really samples: the three samples of a prompt are not all the same.
    responses = out.batch["responses"].view(6, 3, -1)
    assert any(not torch.equal(group[0], group[1]) for group in responses)

    expected = hf.log_probs(wide_head_models["a"], out, temperature=0.7) * mask
    torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=2e-4, rtol=1e-4)


def test_same_seed_same_samples(engine: Any) -> None:
    prompts = make_prompts(random_prompt_ids(4, seed=3), PAD)
    sampling = SamplingConfig(n=2, temperature=1.0, top_k=20, max_new_tokens=6, seed=5)
    first = engine.generate(prompts, sampling).batch["responses"]
    second = engine.generate(prompts, sampling).batch["responses"]
    assert torch.equal(first, second)


def test_update_weights_switches_model(
    engine: Any, hf: Any, wide_head_models: dict[str, Path]
) -> None:
    prompts = make_prompts(random_prompt_ids(10, seed=4), PAD)
    engine.sleep()  # on CPU a no-op, but generate must refuse to run until wake_up
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(prompts, SamplingConfig(greedy=True))
    # Tied qwen2: state_dict() has lm_head.weight sharing storage with embed_tokens.weight.
    engine.update_weights(hf.model(wide_head_models["b"]).state_dict().items())
    engine.wake_up()
    check_greedy(engine, hf, wide_head_models["b"], prompts)
    engine.update_weights(hf.model(wide_head_models["a"]).state_dict().items())
    check_greedy(engine, hf, wide_head_models["a"], prompts)


class ReplyEnvironment:
    """Replies with the token ids 11, 12 (as text of the 1-char codec) for three turns."""

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        self.turns = 0

    def step(self, model_text: str) -> StepResult:
        self.turns += 1
        return StepResult(chr(11) + chr(12), done=self.turns >= 3)


class CharCodec:
    """One token per character code (the tiny models' ids are below 128)."""

    def encode(self, text: str) -> list[int]:
        return [ord(char) for char in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)


def check_agent_loop_matches_native(rollout: Any, path: Path, prompts: list[list[int]]) -> None:
    """A greedy 3-turn agent loop on vLLM (prefix cache on) equals the native engine's."""
    sampling = SamplingConfig(greedy=True, max_new_tokens=8)
    config = AgentLoopConfig(max_turns=3, max_response_tokens=40)
    native = NativeRollout(RolloutConfig(model_path=str(path), pad_token_id=PAD))
    batch = make_prompts(prompts, PAD)
    out = run_agent_loop(rollout, batch, ReplyEnvironment, CharCodec(), sampling, config)
    expected = run_agent_loop(native, batch, ReplyEnvironment, CharCodec(), sampling, config)
    assert out.non_tensor_batch["num_turns"].tolist() == [3] * len(prompts)
    assert torch.equal(out.batch["responses"], expected.batch["responses"])
    assert torch.equal(out.batch["response_mask"], expected.batch["response_mask"])
    assert (out.batch["response_mask"] == 0).any()  # the replies are in, masked


def test_prefix_caching_serves_a_follow_up_turn_and_resets_on_update(
    hf: Any, wide_head_models: dict[str, Path]
) -> None:
    """``prefix_cache_rows`` turns on vLLM's prefix cache; a turn that extends the last one
    samples what transformers does, also right after a weight update (the cache is reset)."""
    rollout = build_rollout(
        RolloutConfig(
            backend="vllm",
            model_path=str(wide_head_models["a"]),
            pad_token_id=PAD,
            max_model_len=128,
            prefix_cache_rows=16,
            engine_kwargs={"kv_cache_space_gib": 1},
        )
    )
    try:
        assert rollout.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
        first = random_prompt_ids(6, min_length=40, max_length=48, seed=7)
        sampling = SamplingConfig(greedy=True, max_new_tokens=16)
        out = rollout.generate(make_prompts(first, PAD), sampling)
        responses, mask = out.batch["responses"], out.batch["response_mask"].bool()
        follow_up = [
            [*ids, *responses[row][mask[row]].tolist(), 11, 12] for row, ids in enumerate(first)
        ]
        hf.check_greedy(rollout, wide_head_models["a"], make_prompts(follow_up, PAD))
        check_agent_loop_matches_native(rollout, wide_head_models["a"], first)
        rollout.update_weights(hf.model(wide_head_models["b"]).state_dict().items())
        hf.check_greedy(rollout, wide_head_models["b"], make_prompts(follow_up, PAD))
    finally:
        rollout.shutdown()
