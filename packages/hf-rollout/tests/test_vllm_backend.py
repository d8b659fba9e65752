"""The vLLM backend checked against transformers on tiny local models (CPU build, fp32).

Skipped unless vLLM is installed (``bash tools/setup_vllm_env.sh`` makes a venv with the CPU
build). One engine serves the whole module: starting one takes tens of seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_protocol import DataProto
from hf_rollout import RolloutConfig, SamplingConfig, build_rollout
from hf_rollout.testing import build_tiny_model, make_prompts, random_prompt_ids

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PAD = 0
# vLLM's CPU attention supports head sizes from 32 up; the tiny default (8) is too small.
VLLM_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny qwen2 models (tied embeddings) of one architecture, different weights."""
    root = tmp_path_factory.mktemp("vllm-models")
    return {
        "a": build_tiny_model(root / "a", "qwen2", seed=0, **VLLM_SHAPE),
        "b": build_tiny_model(root / "b", "qwen2", seed=1, **VLLM_SHAPE),
    }


@pytest.fixture(scope="module")
def engine(models: dict[str, Path]) -> Iterator[Any]:
    """One vLLM engine on model ``a`` for the module."""
    rollout = build_rollout(
        RolloutConfig(
            backend="vllm",
            model_path=str(models["a"]),
            pad_token_id=PAD,
            max_model_len=128,
            engine_kwargs={"kv_cache_space_gib": 1},
        )
    )
    yield rollout
    rollout.shutdown()


def hf_model(path: Path) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


def hf_greedy(path: Path, prompts: DataProto, max_new_tokens: int, eos: int) -> torch.Tensor:
    """transformers ``generate`` (greedy), responses right-padded with PAD after eos."""
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    out = hf_model(path).generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=PAD,
    )
    return out[:, ids.shape[1] :]


def trim(tokens: torch.Tensor, width: int) -> torch.Tensor:
    """``tokens`` right-padded (or cut) to ``width`` columns."""
    if tokens.shape[1] >= width:
        return tokens[:, :width]
    pad = torch.full((tokens.shape[0], width - tokens.shape[1]), PAD, dtype=tokens.dtype)
    return torch.cat([tokens, pad], dim=1)


def greedy_eos(path: Path, prompts: DataProto) -> int:
    """A token that some (not all) greedy continuations produce, to exercise stopping."""
    reference = hf_greedy(path, prompts, max_new_tokens=10, eos=PAD + 127)
    return int(reference[:, :5].flatten().mode().values)


def check_greedy(engine: Any, path: Path, prompts: DataProto) -> None:
    eos = greedy_eos(path, prompts)
    reference = hf_greedy(path, prompts, max_new_tokens=10, eos=eos)
    out = engine.generate(prompts, SamplingConfig(greedy=True, max_new_tokens=10, eos_token_id=eos))
    responses = out.batch["responses"]
    assert torch.equal(responses, trim(reference, responses.shape[1]))
    finished = (responses == eos).any(dim=1)
    assert finished.any() and not finished.all()


def test_greedy_equals_transformers_generate(engine: Any, models: dict[str, Path]) -> None:
    prompts = make_prompts(random_prompt_ids(12, seed=1), PAD)
    check_greedy(engine, models["a"], prompts)


def test_sampled_log_probs_match_transformers_forward(engine: Any, models: dict[str, Path]) -> None:
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

    with torch.no_grad():
        logits = hf_model(models["a"])(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits.float()
    log_probs = torch.log_softmax(logits[:, width - 1 : -1] / 0.7, dim=-1)
    expected = log_probs.gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1) * mask
    torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=2e-4, rtol=1e-4)


def test_same_seed_same_samples(engine: Any) -> None:
    prompts = make_prompts(random_prompt_ids(4, seed=3), PAD)
    sampling = SamplingConfig(n=2, temperature=1.0, top_k=20, max_new_tokens=6, seed=5)
    first = engine.generate(prompts, sampling).batch["responses"]
    second = engine.generate(prompts, sampling).batch["responses"]
    assert torch.equal(first, second)


def test_update_weights_switches_model(engine: Any, models: dict[str, Path]) -> None:
    prompts = make_prompts(random_prompt_ids(10, seed=4), PAD)
    engine.sleep()  # on CPU a no-op, but generate must refuse to run until wake_up
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(prompts, SamplingConfig(greedy=True))
    # Tied qwen2: state_dict() has lm_head.weight sharing storage with embed_tokens.weight.
    engine.update_weights(hf_model(models["b"]).state_dict().items())
    engine.wake_up()
    check_greedy(engine, models["b"], prompts)
    engine.update_weights(hf_model(models["a"]).state_dict().items())
    check_greedy(engine, models["a"], prompts)
