"""The SGLang backend checked against transformers on tiny local models (GPU only).

Skipped unless CUDA and SGLang are both present. One engine serves the whole module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_rollout import RolloutConfig, SamplingConfig, build_rollout
from hf_rollout.testing import make_prompts, random_prompt_ids

if not torch.cuda.is_available():
    pytest.skip("the SGLang backend needs a CUDA device", allow_module_level=True)
pytest.importorskip("sglang")

pytestmark = [pytest.mark.gpu, pytest.mark.sglang, pytest.mark.timeout(900)]

PAD = 0


@pytest.fixture(scope="module")
def engine(wide_head_models: dict[str, Path]) -> Iterator[Any]:
    """One SGLang engine on model ``a`` for the module (fp32, no CUDA graphs)."""
    rollout = build_rollout(
        RolloutConfig(
            backend="sglang",
            model_path=str(wide_head_models["a"]),
            pad_token_id=PAD,
            max_model_len=128,
            engine_kwargs={"mem_fraction_static": 0.2, "disable_cuda_graph": True},
        )
    )
    yield rollout
    rollout.shutdown()


def test_greedy_equals_transformers_generate(
    engine: Any, hf: Any, wide_head_models: dict[str, Path]
) -> None:
    prompts = make_prompts(random_prompt_ids(12, seed=1), PAD)
    hf.check_greedy(engine, wide_head_models["a"], prompts)


def test_sampled_log_probs_match_transformers_forward(
    engine: Any, hf: Any, wide_head_models: dict[str, Path]
) -> None:
    prompts = make_prompts(random_prompt_ids(6, seed=2), PAD)
    out = engine.generate(prompts, SamplingConfig(n=3, temperature=0.7, max_new_tokens=8))
    assert out.batch["responses"].shape[0] == 18
    mask = out.batch["response_mask"]
    expected = hf.log_probs(wide_head_models["a"], out, temperature=0.7) * mask
    # GPU kernels (TF32 matmuls) differ from the CPU reference more than the CPU backends.
    torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=2e-2, rtol=1e-2)


def test_update_weights_switches_model(
    engine: Any, hf: Any, wide_head_models: dict[str, Path]
) -> None:
    prompts = make_prompts(random_prompt_ids(10, seed=4), PAD)
    engine.sleep()
    engine.update_weights(hf.model(wide_head_models["b"]).state_dict().items())
    engine.wake_up()
    hf.check_greedy(engine, wide_head_models["b"], prompts)
    engine.update_weights(hf.model(wide_head_models["a"]).state_dict().items())
    hf.check_greedy(engine, wide_head_models["a"], prompts)
