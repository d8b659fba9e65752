"""Stage ``sp_path``: the Ulysses sequence-parallel forward on one device, against the plain one.

Usage: ``python tools/gpu/ulysses_check.py cuda|cpu OUT_DIR`` (our packages on ``PYTHONPATH``).

One GPU cannot hold two NCCL ranks, so sequence parallelism larger than 1 is proven on the
CPU (``packages/hf-engines/tests/test_fsdp_ulysses.py``, gloo). On the GPU this stage runs
the same code path in a group of one rank (NCCL): the packed rows, the all-to-alls around
attention, causal SDPA once per packed row (``hf_ulysses_sdpa``) and the gather of the
scored outputs. It checks that the log-probs and the gradient norm equal the engine's plain
forward (``forward_micro_batch``, padding removal ``pack``) on the same rows, and times
forward + backward of both with their peak memory, which gives the per-row attention loop's
cost on CUDA kernels. Writes ``sp.json`` to OUT_DIR.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hf_engines import EngineConfig, FSDPConfig, ModelConfig
from hf_engines.fsdp.forward import forward_micro_batch
from hf_engines.fsdp.sp_forward import forward_sequence_parallel
from hf_engines.fsdp.ulysses import enable_ulysses
from hf_engines.micro_batch import batch_tensors
from hf_engines.models import build_hf_model
from hf_engines.testing import make_toy_batch

SIZES = {
    # Qwen2.5-0.5B's width and heads, 8 layers, 4 rows of 2048 tokens
    "cuda": {"hidden": 896, "layers": 8, "heads": 14, "kv": 2, "ffn": 4864, "vocab": 32768},
    "cpu": {"hidden": 64, "layers": 2, "heads": 4, "kv": 2, "ffn": 128, "vocab": 256},
}
ROWS = {"cuda": (4, 1024, 1024), "cpu": (2, 16, 16)}
"""rows, prompt tokens, response tokens."""
REPEATS = 3


def engine_config(device: str) -> EngineConfig:
    """A random Qwen2 of :data:`SIZES` in fp32 with SDPA attention, sp=1."""
    size = SIZES[device]
    hf_config = {
        "model_type": "qwen2",
        "hidden_size": size["hidden"],
        "num_hidden_layers": size["layers"],
        "num_attention_heads": size["heads"],
        "num_key_value_heads": size["kv"],
        "intermediate_size": size["ffn"],
        "vocab_size": size["vocab"],
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    }
    model = ModelConfig(hf_config=hf_config, seed=0, attn_implementation="sdpa")
    return EngineConfig(model=model, fsdp=FSDPConfig(ulysses_sequence_parallel_size=1))


def timed(step: Callable[[], dict[str, Any]], device: str) -> tuple[dict[str, Any], float, float]:
    """Run ``step`` :data:`REPEATS` times; its last result, median seconds, peak GiB."""
    times, result = [], {}
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(REPEATS):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
    return result, statistics.median(times), peak


def forward_backward(
    model: torch.nn.Module, forward: Callable[..., Any], *args: Any
) -> dict[str, Any]:
    """One forward of ``forward`` and the backward of its log-prob sum; outputs and grad norm."""
    model.zero_grad(set_to_none=True)
    outputs = forward(model, *args)
    outputs["log_probs"].sum().backward()
    norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])
    )
    return {"log_probs": outputs["log_probs"].detach().cpu(), "grad_norm": float(norm)}


def main(device: str, out_dir: str) -> int:
    """Compare the two paths; write ``sp.json``; 1 if they disagree."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, rank=0, world_size=1)
    config = engine_config(device)
    plain, ulysses = build_hf_model(config.model), build_hf_model(config.model)
    enable_ulysses(ulysses, config)
    for model in (plain, ulysses):
        torch.nn.Module.to(model, device)
    rows, prompt, response = ROWS[device]
    batch = make_toy_batch(
        rows,
        prompt_length=prompt,
        response_length=response,
        seed=3,
        vocab_size=SIZES[device]["vocab"],
    )
    tensors = batch_tensors(batch)
    inputs = {
        key: tensors[key].to(device) for key in ("input_ids", "attention_mask", "position_ids")
    }
    responses = tensors["responses"].to(device)
    want, plain_s, plain_gib = timed(
        lambda: forward_backward(plain, forward_micro_batch, inputs, responses, False, 1.0, "pack"),
        device,
    )
    group = dist.group.WORLD
    got, sp_s, sp_gib = timed(
        lambda: forward_backward(
            ulysses, forward_sequence_parallel, inputs, responses, False, 1.0, group
        ),
        device,
    )
    gap = float((got["log_probs"] - want["log_probs"]).abs().max())
    norm_gap = abs(got["grad_norm"] - want["grad_norm"]) / max(want["grad_norm"], 1e-12)
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "backend": backend,
        "rows x tokens": [rows, prompt + response],
        "max_log_prob_gap": gap,
        "grad_norm_rel_gap": norm_gap,
        "plain_s": plain_s,
        "sp_path_s": sp_s,
        "plain_peak_gib": plain_gib,
        "sp_path_peak_gib": sp_gib,
    }
    print(json.dumps(result), flush=True)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "sp.json").write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()
    return 0 if gap < 1e-3 and norm_gap < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
