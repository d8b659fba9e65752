"""Test helpers shared by the packages: DataProto assertions and tiny models.

The configs are plain dicts and :func:`save_tiny_model` imports transformers only when
called, so hf-protocol keeps its dependencies while hf-engines and hf-rollout (which have
transformers but do not depend on each other) build their tiny test models from one
definition.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from hf_protocol.columns import tensor_columns, values_equal
from hf_protocol.data_proto import DataProto


def assert_dataproto_equal(actual: DataProto, expected: DataProto, check_meta: bool = True) -> None:
    """Raise ``AssertionError`` naming the first difference between two DataProtos.

    Tensors must match in dtype, shape and values (NaN equal to NaN); numpy columns
    element by element; meta_info by value when ``check_meta``.
    """
    assert len(actual) == len(expected), f"lengths differ: {len(actual)} != {len(expected)}"
    assert (actual.batch is None) == (expected.batch is None), "one side has no tensor batch"
    if actual.batch is not None and expected.batch is not None:
        got, want = tensor_columns(actual.batch), tensor_columns(expected.batch)
        assert got.keys() == want.keys(), f"batch keys differ: {sorted(got)} != {sorted(want)}"
        for key, tensor in want.items():
            other = got[key]
            assert other.dtype == tensor.dtype, (
                f"batch[{key!r}] dtype {other.dtype} != {tensor.dtype}"
            )
            assert other.shape == tensor.shape, (
                f"batch[{key!r}] shape {other.shape} != {tensor.shape}"
            )
            same = torch.equal(other, tensor) or (
                other.is_floating_point()
                and bool(torch.allclose(other, tensor, 0, 0, equal_nan=True))
            )
            assert same, f"batch[{key!r}] values differ"
    got_nt, want_nt = actual.non_tensor_batch, expected.non_tensor_batch
    assert got_nt.keys() == want_nt.keys(), (
        f"non_tensor_batch keys differ: {sorted(got_nt)} != {sorted(want_nt)}"
    )
    for key, array in want_nt.items():
        other_array = got_nt[key]
        assert other_array.dtype == array.dtype, (
            f"non_tensor_batch[{key!r}] dtype {other_array.dtype} != {array.dtype}"
        )
        assert values_equal(other_array, array), f"non_tensor_batch[{key!r}] differs"
    if check_meta:
        assert values_equal(actual.meta_info, expected.meta_info), (
            f"meta_info differs: {actual.meta_info!r:.200} != {expected.meta_info!r:.200}"
        )


_TINY_DECODER: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
}

TINY_DECODER_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", **_TINY_DECODER},
    # Tied embeddings exercise the export path that must not write lm_head twice.
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": True, **_TINY_DECODER},
    "qwen3": {"model_type": "qwen3", "head_dim": 8, **_TINY_DECODER},
    # A mixture of experts: every layer's MLP is 4 experts (16 channels each), top-2 routed.
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "head_dim": 8,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "norm_topk_prob": True,
        **_TINY_DECODER,
    },
    # Gemma 3 text: a sliding-window layer (window 4, shorter than most test sequences)
    # then a global one, tied and scaled embeddings, q/k norms, gelu-tanh MLP.
    "gemma3": {
        "model_type": "gemma3_text",
        "head_dim": 8,
        "query_pre_attn_scalar": 8,
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"],
        "tie_word_embeddings": True,
        **_TINY_DECODER,
    },
}
"""Tiny decoder configs by family (``transformers`` config fields): hidden 32, 2 layers,
4 heads (2 key/value), vocab 128; ``qwen3_moe`` has 4 experts, top-2; ``gemma3``
(``gemma3_text``) alternates a sliding-window (4 tokens) and a global layer. Models built
from them get random weights."""


def tiny_decoder_config(family: str, **overrides: Any) -> dict[str, Any]:
    """A copy of :data:`TINY_DECODER_CONFIGS` ``[family]`` with ``overrides`` applied."""
    if family not in TINY_DECODER_CONFIGS:
        raise ValueError(
            f"unknown tiny model family {family!r}; choose from {sorted(TINY_DECODER_CONFIGS)}"
        )
    return {**TINY_DECODER_CONFIGS[family], **overrides}


def save_tiny_model(
    directory: str | os.PathLike[str], config: dict[str, Any], seed: int = 0
) -> Path:
    """Save a randomly initialised causal LM built from ``config`` to ``directory``.

    ``config`` holds ``model_type`` and the transformers config fields (e.g. from
    :func:`tiny_decoder_config`); the same seed gives the same weights and the global RNG
    is left as it was. Needs ``transformers`` (hf-engines and hf-rollout install it).
    """
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as error:  # hf-protocol alone does not install transformers
        raise ImportError(
            "save_tiny_model needs transformers; pip install transformers (hf-engines and "
            "hf-rollout bring it)"
        ) from error
    options = dict(config)
    model_config = AutoConfig.for_model(options.pop("model_type"), **options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(model_config, dtype=torch.float32)
    path = Path(directory)
    model.save_pretrained(path)
    return path
