"""Shared fixtures: tiny models built locally (no hub), once per test session, and the
transformers reference that every backend's output is checked against."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_protocol import DataProto
from hf_rollout import SamplingConfig
from hf_rollout.testing import build_tiny_model

torch.set_num_threads(1)  # several test runs share two cores
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

PAD = 0
"""The pad id of every prompt batch in these tests."""

WIDE_HEAD_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}
"""Head size 32: vLLM's CPU attention and SGLang's kernels reject the tiny default (8)."""


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Directories of tiny random models: ``llama``, ``qwen2``, ``qwen3`` and ``qwen2_other``.

    ``qwen2_other`` has the architecture of ``qwen2`` with different weights (another seed).
    """
    root = tmp_path_factory.mktemp("tiny-models")
    return {
        "llama": build_tiny_model(root / "llama", "llama"),
        "qwen2": build_tiny_model(root / "qwen2", "qwen2"),
        "qwen3": build_tiny_model(root / "qwen3", "qwen3"),
        "qwen2_other": build_tiny_model(root / "qwen2_other", "qwen2", seed=1),
    }


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray cluster on loopback, shared by every test of the session."""
    import ray

    from hf_controller import ensure_ray

    ensure_ray(num_cpus=4, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def wide_head_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny qwen2 models (tied embeddings, head size 32), ``a`` and ``b``: one
    architecture, different weights (seeds 0 and 1). For the vLLM and SGLang engines."""
    root = tmp_path_factory.mktemp("wide-head-models")
    return {
        "a": build_tiny_model(root / "a", "qwen2", seed=0, **WIDE_HEAD_SHAPE),
        "b": build_tiny_model(root / "b", "qwen2", seed=1, **WIDE_HEAD_SHAPE),
    }


class TransformersReference:
    """What a rollout backend must reproduce: transformers (fp32) on the same model."""

    def model(self, path: Path) -> torch.nn.Module:
        """The causal LM at ``path`` in fp32, eval mode."""
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def greedy(self, path: Path, prompts: DataProto, max_new_tokens: int, eos: int) -> torch.Tensor:
        """transformers ``generate`` (greedy) on ``prompts``; the new tokens, PAD after eos."""
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        out = self.model(path).generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=PAD,
        )
        return out[:, ids.shape[1] :]

    def greedy_eos(self, path: Path, prompts: DataProto) -> int:
        """A token that some (not all) greedy continuations produce, to exercise stopping."""
        reference = self.greedy(path, prompts, max_new_tokens=10, eos=PAD + 127)
        return int(reference[:, :5].flatten().mode().values)

    def trim(self, tokens: torch.Tensor, width: int) -> torch.Tensor:
        """``tokens`` right-padded with PAD (or cut) to ``width`` columns."""
        if tokens.shape[1] >= width:
            return tokens[:, :width]
        pad = torch.full((tokens.shape[0], width - tokens.shape[1]), PAD, dtype=tokens.dtype)
        return torch.cat([tokens, pad], dim=1)

    def check_greedy(self, engine: Any, path: Path, prompts: DataProto) -> tuple[DataProto, int]:
        """Greedy ``engine`` output (10 tokens, eos from :meth:`greedy_eos`) must equal
        transformers' token for token; returns the output and the eos."""
        eos = self.greedy_eos(path, prompts)
        reference = self.greedy(path, prompts, max_new_tokens=10, eos=eos)
        sampling = SamplingConfig(greedy=True, max_new_tokens=10, eos_token_id=eos)
        out = engine.generate(prompts, sampling)
        responses = out.batch["responses"]
        assert torch.equal(responses, self.trim(reference, responses.shape[1]))
        return out, eos

    def log_probs(self, path: Path, out: DataProto, temperature: float) -> torch.Tensor:
        """log_softmax(logits / temperature) of a forward over ``out``'s whole rows, at each
        response token; ``(B, R)``, padding not masked."""
        with torch.no_grad():
            logits = self.model(path)(
                input_ids=out.batch["input_ids"],
                attention_mask=out.batch["attention_mask"],
                position_ids=out.batch["position_ids"],
            ).logits
        responses = out.batch["responses"]
        width = responses.shape[1]
        log_probs = torch.log_softmax(logits[:, -width - 1 : -1].float() / temperature, dim=-1)
        return log_probs.gather(-1, responses.unsqueeze(-1)).squeeze(-1)


@pytest.fixture(scope="session")
def hf() -> TransformersReference:
    """The transformers reference (see :class:`TransformersReference`)."""
    return TransformersReference()
