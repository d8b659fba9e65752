"""The native backend keeps no generation memory: its KV cache dies with ``generate``.

Measured, not assumed: the bytes of every live torch tensor (``gc.get_objects()``, each
storage once) before and after generations and after ``sleep``, with the garbage collector
off, so a reference cycle holding the cache would show as growth. On CUDA the allocator's
count must also come back, and ``sleep`` must give the weights' memory back.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.testing import make_prompts, random_prompt_ids

PAD = 0
TOLERANCE = 4096
"""Bytes a measurement may drift (a few small bookkeeping tensors)."""


def live_tensor_bytes() -> int:
    """Bytes of the storages of all live tensors the garbage collector tracks, each once."""
    storages: dict[tuple[str, int], int] = {}
    for obj in gc.get_objects():
        try:
            if not issubclass(type(obj), torch.Tensor) or obj.device.type == "meta":
                continue
            storage = obj.untyped_storage()
            storages[(str(obj.device), storage.data_ptr())] = storage.nbytes()
        except Exception:  # an object whose isinstance or storage access fails is no tensor
            continue
    return sum(storages.values())


def kv_cache_bytes(engine: NativeRollout, rows: int, tokens: int) -> int:
    """Bytes of keys and values for ``rows`` sequences of ``tokens`` tokens (float32)."""
    config = engine.hf_config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return 2 * config.num_hidden_layers * rows * kv_heads * tokens * head_dim * 4


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers-forward"])
def test_generate_retains_no_kv_cache_and_sleep_frees(
    tiny_models: dict[str, Path], lean: bool, device: str
) -> None:
    engine = NativeRollout(
        RolloutConfig(
            model_path=str(tiny_models["llama"]),
            pad_token_id=PAD,
            device=device,
            max_model_len=40,  # small rotary tables (the lean forward keeps them until sleep)
            engine_kwargs={"lean_forward": lean},
        )
    )
    prompts = make_prompts(random_prompt_ids(8, seed=5), PAD)
    sampling = SamplingConfig(n=4, temperature=1.0, max_new_tokens=24, seed=0)
    # The cache these calls build is far bigger than the tolerance, so keeping it would show.
    assert kv_cache_bytes(engine, rows=32, tokens=24) > 10 * TOLERANCE
    gc.collect()
    before = live_tensor_bytes()  # before any generation: weights only
    cuda_before = torch.cuda.memory_allocated() if device == "cuda" else 0
    gc.disable()  # objects must die by reference counting: no cycle may hold the cache
    try:
        for _ in range(3):
            output = engine.generate(prompts, sampling)
            assert output.batch is not None and output.batch["responses"].shape[0] == 32
            del output
        after = live_tensor_bytes()
        cuda_after = torch.cuda.memory_allocated() if device == "cuda" else 0
        engine.sleep()
        asleep = live_tensor_bytes()
        cuda_asleep = torch.cuda.memory_allocated() if device == "cuda" else 0
    finally:
        gc.enable()
    assert abs(after - before) <= TOLERANCE, f"generate left {after - before} bytes alive"
    assert asleep <= before + TOLERANCE, f"sleep left {asleep - before} more bytes"
    if device == "cuda":
        weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
        assert abs(cuda_after - cuda_before) <= TOLERANCE
        assert cuda_asleep <= cuda_before - weights + TOLERANCE  # the weights left the GPU
    engine.wake_up()
    assert len(engine.generate(prompts, sampling)) == 32
