"""The SGLang backend checked against transformers on tiny local models (GPU only).

Skipped unless CUDA and SGLang are both present. One engine serves the whole module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_protocol import DataProto
from hf_rollout import RolloutConfig, SamplingConfig, build_rollout
from hf_rollout.testing import build_tiny_model, make_prompts, random_prompt_ids

if not torch.cuda.is_available():
    pytest.skip("the SGLang backend needs a CUDA device", allow_module_level=True)
pytest.importorskip("sglang")

pytestmark = [pytest.mark.gpu, pytest.mark.sglang, pytest.mark.timeout(900)]

PAD = 0
# Head size 32 (attention kernels reject the tiny default of 8).
SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny qwen2 models of one architecture, different weights."""
    root = tmp_path_factory.mktemp("sglang-models")
    return {
        "a": build_tiny_model(root / "a", "qwen2", seed=0, **SHAPE),
        "b": build_tiny_model(root / "b", "qwen2", seed=1, **SHAPE),
    }


@pytest.fixture(scope="module")
def engine(models: dict[str, Path]) -> Iterator[Any]:
    """One SGLang engine on model ``a`` for the module (fp32, no CUDA graphs)."""
    rollout = build_rollout(
        RolloutConfig(
            backend="sglang",
            model_path=str(models["a"]),
            pad_token_id=PAD,
            max_model_len=128,
            engine_kwargs={"mem_fraction_static": 0.2, "disable_cuda_graph": True},
        )
    )
    yield rollout
    rollout.shutdown()


def hf_model(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(path: Path, prompts: DataProto, max_new_tokens: int, eos: int) -> torch.Tensor:
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
    if tokens.shape[1] >= width:
        return tokens[:, :width]
    pad = torch.full((tokens.shape[0], width - tokens.shape[1]), PAD, dtype=tokens.dtype)
    return torch.cat([tokens, pad], dim=1)


def check_greedy(engine: Any, path: Path, prompts: DataProto) -> None:
    probe = hf_greedy(path, prompts, max_new_tokens=10, eos=PAD + 127)
    eos = int(probe[:, :5].flatten().mode().values)
    reference = hf_greedy(path, prompts, max_new_tokens=10, eos=eos)
    out = engine.generate(prompts, SamplingConfig(greedy=True, max_new_tokens=10, eos_token_id=eos))
    responses = out.batch["responses"]
    assert torch.equal(responses, trim(reference, responses.shape[1]))


def test_greedy_equals_transformers_generate(engine: Any, models: dict[str, Path]) -> None:
    check_greedy(engine, models["a"], make_prompts(random_prompt_ids(12, seed=1), PAD))


def test_sampled_log_probs_match_transformers_forward(engine: Any, models: dict[str, Path]) -> None:
    prompts = make_prompts(random_prompt_ids(6, seed=2), PAD)
    out = engine.generate(prompts, SamplingConfig(n=3, temperature=0.7, max_new_tokens=8))
    assert out.batch["responses"].shape[0] == 18
    width = out.batch["prompts"].shape[1]
    mask = out.batch["response_mask"]
    with torch.no_grad():
        logits = hf_model(models["a"])(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits.float()
    log_probs = torch.log_softmax(logits[:, width - 1 : -1] / 0.7, dim=-1)
    expected = log_probs.gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1) * mask
    # GPU kernels (TF32 matmuls) differ from the CPU reference more than the CPU backends.
    torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=2e-2, rtol=1e-2)


def test_update_weights_switches_model(engine: Any, models: dict[str, Path]) -> None:
    prompts = make_prompts(random_prompt_ids(10, seed=4), PAD)
    engine.sleep()
    engine.update_weights(hf_model(models["b"]).state_dict().items())
    engine.wake_up()
    check_greedy(engine, models["b"], prompts)
    engine.update_weights(hf_model(models["a"]).state_dict().items())
    check_greedy(engine, models["a"], prompts)
