"""Stage ``vllm_smoke``: vLLM by itself (no HybridFlow code in the loop) on a tiny local qwen2:
greedy tokens against transformers' ``generate`` on the same weights and dtype.

Usage: ``python tools/gpu/smoke_vllm.py cuda|cpu OUT_DIR``; writes ``OUT_DIR/smoke.json``.
bf16 on the GPU (the bundle carries FA3, not FA2: no fp32 attention), fp32 on the CPU build.
bf16 sums in another order can flip a near-tie late in a sequence, so agreement is counted
per position; the first generated token of every prompt must agree.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from hf_rollout.testing import build_tiny_model, random_prompt_ids

NEW_TOKENS = 16


def hf_greedy(
    model_dir: Path, prompts: list[list[int]], device: str, dtype: torch.dtype
) -> list[list[int]]:
    """transformers' greedy continuation of each prompt (no eos stop)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    torch.nn.Module.to(model, torch.device(device)).eval()
    out = []
    for ids in prompts:
        x = torch.tensor([ids], device=device)
        y = model.generate(
            x, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
        )
        out.append(y[0, len(ids) :].tolist())
    return out


def main(device: str, out_dir: str) -> int:
    """Generate with vLLM and transformers; write the agreement; 1 if a first token differs."""
    from vllm import LLM, SamplingParams

    gpu = device == "cuda"
    if not gpu:  # the CPU build's KV cache, in GiB (default 4); as the rollout backend sets it
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    dtype = torch.bfloat16 if gpu else torch.float32
    model_dir = build_tiny_model(
        Path(tempfile.mkdtemp()) / "qwen2",
        "qwen2",
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    prompts = random_prompt_ids(8, seed=11)
    start = time.perf_counter()
    options = {"gpu_memory_utilization": 0.2} if gpu else {}
    llm = LLM(
        model=str(model_dir),
        skip_tokenizer_init=True,
        dtype=str(dtype).split(".")[1],
        enforce_eager=True,
        seed=0,
        max_model_len=256,
        **options,
    )
    started = time.perf_counter() - start
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, detokenize=False
    )
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    ours = [list(o.outputs[0].token_ids) for o in outputs]
    theirs = hf_greedy(model_dir, prompts, device, dtype)
    agree = [
        next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), NEW_TOKENS)
        for x, y in zip(ours, theirs, strict=True)
    ]
    result = {
        "engine_start_s": round(started, 1),
        "agreeing_prefix": agree,
        "new_tokens": NEW_TOKENS,
        "dtype": str(dtype),
    }
    Path(out_dir, "smoke.json").write_text(json.dumps(result))
    print(json.dumps(result))
    return 0 if min(agree) > 0 and (gpu or min(agree) == NEW_TOKENS) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
