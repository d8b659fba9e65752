"""Chunked log-probs and entropy equal the full-logits path, and keep no (N, V) tensor.

The reference is plain autograd over full float32 logits, as ``fsdp.outputs`` computes
them; the chunked path must match its values and the gradients of every input and model
parameter, on a tiny Llama (untied head) and a tiny Gemma 3 (tied embeddings, logit
softcap, scaled embeddings), at temperatures 1 and != 1.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hf_engines import FSDPEngine
from hf_engines.chunked_logprob import HeadMath, chunk_tokens, chunked_log_probs
from hf_engines.config import (
    ConfigurationError,
    EngineConfig,
    FSDPConfig,
    ModelConfig,
    OptimConfig,
)
from hf_engines.output_head import model_token_log_probs, output_head, token_scorer
from hf_engines.testing import make_toy_batch, toy_nll_loss, transformers_log_probs
from hf_protocol.testing import save_tiny_model

VOCAB = 512
TINY: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "tie_word_embeddings": False},
    "gemma3": {
        "model_type": "gemma3_text",
        "tie_word_embeddings": True,
        "final_logit_softcapping": 3.0,
        "sliding_window": 4,
        "query_pre_attn_scalar": 8,
        "head_dim": 8,
    },
}
_COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}


def tiny_model(family: str, **overrides: Any) -> torch.nn.Module:
    options = {**_COMMON, **TINY[family], **overrides}
    config = AutoConfig.for_model(options.pop("model_type"), **options)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def full_log_probs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    log_softmax = torch.log_softmax(logits.float() / temperature, dim=-1)
    log_probs = log_softmax.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return log_probs, -(log_softmax.exp() * log_softmax).sum(-1)


@pytest.mark.parametrize("math", [HeadMath(), HeadMath(scale=0.5, softcap=2.0, temperature=0.7)])
@pytest.mark.parametrize("chunk", [1, 5, 64])
@pytest.mark.parametrize("terms", ["both", "log_probs", "entropy"])
@pytest.mark.parametrize("masked", [False, True])
def test_function_matches_full_logits(math: HeadMath, chunk: int, terms: str, masked: bool) -> None:
    """``masked``: tokens the loss weighs 0 (a whole row, and every other token), which the
    backward skips, get zero gradients and the others the full path's."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, 16, generator=generator, requires_grad=True)
    weight = torch.randn(40, 16, generator=generator).mul_(0.5).requires_grad_()
    bias = torch.randn(40, generator=generator, requires_grad=True)
    targets = torch.randint(0, 40, (3, 7), generator=generator)
    a, b = torch.randn(3, 7, generator=generator), torch.randn(3, 7, generator=generator)
    if masked:
        for weights in (a, b):
            weights[1] = 0.0
            weights[:, ::2] = 0.0

    def loss(log_probs: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
        lp_term, ent_term = (log_probs * a).sum(), (entropy * b).sum()
        return {"both": lp_term + ent_term, "log_probs": lp_term, "entropy": ent_term}[terms]

    logits = torch.nn.functional.linear(hidden, weight, bias) * math.scale
    if math.softcap is not None:
        logits = torch.tanh(logits / math.softcap) * math.softcap
    expected = full_log_probs(logits, targets, math.temperature)
    expected_grads = torch.autograd.grad(loss(*expected), (hidden, weight, bias))
    actual = chunked_log_probs(hidden, weight, bias, targets, math, chunk)
    actual_grads = torch.autograd.grad(loss(*actual), (hidden, weight, bias))
    for got, want in zip((*actual, *actual_grads), (*expected, *expected_grads), strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_chunk_tokens_fits_the_budget() -> None:
    assert chunk_tokens(7, 262_144) == 7
    assert chunk_tokens(None, 262_144) == 128
    assert chunk_tokens(None, 49_152) == 682
    assert chunk_tokens(None, 1 << 30) == 1
    with pytest.raises(ValueError, match="chunk_size=0"):
        chunk_tokens(0, 10)


def _parameter_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_model_path_matches_full_logits(family: str, temperature: float) -> None:
    model = tiny_model(family)
    head = output_head(model)
    assert head is not None
    ids = torch.randint(1, VOCAB, (3, 12), generator=torch.Generator().manual_seed(1))
    targets, length = ids[:, -5:], 5
    weights = torch.linspace(-1.0, 1.0, 15).view(3, 5)

    logits = model(input_ids=ids, use_cache=False, logits_to_keep=length + 1).logits[:, :-1]
    expected = full_log_probs(logits, targets, temperature)
    ((expected[0] * weights).sum() + 0.1 * expected[1].sum()).backward()
    expected_grads = _parameter_grads(model)

    select = (slice(None), slice(-length - 1, -1))
    inputs = {"input_ids": ids, "use_cache": False}
    actual = model_token_log_probs(model, head, inputs, select, targets, temperature, 4)
    ((actual[0] * weights).sum() + 0.1 * actual[1].sum()).backward()
    actual_grads = _parameter_grads(model)

    assert "forward" not in vars(model)  # the model's own forward is back
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    assert actual_grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(actual_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    if family == "gemma3":  # tied: one parameter is both the embeddings and the head
        assert head.projection.weight is model.get_input_embeddings().weight


def _saved_shapes(run: Any) -> list[torch.Size]:
    """Shapes of every tensor autograd saves for the backward while ``run()`` runs."""
    shapes: list[torch.Size] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        shapes.append(tensor.shape)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return shapes


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_no_vocabulary_sized_activation_is_saved(family: str) -> None:
    """The chunked path saves nothing ``(..., V)`` for the backward; the full path does."""
    model = tiny_model(family, vocab_size=4096)
    head = output_head(model)
    assert head is not None
    ids = torch.randint(1, 4096, (2, 40), generator=torch.Generator().manual_seed(2))
    targets = ids[:, -32:]
    select = (slice(None), slice(-33, -1))
    inputs = {"input_ids": ids, "use_cache": False}

    def chunked() -> None:
        model_token_log_probs(model, head, inputs, select, targets, 0.8, 8)

    def full() -> None:
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=33).logits[:, :-1]
        full_log_probs(logits, targets, 0.8)

    largest_chunked = max(shape.numel() for shape in _saved_shapes(chunked))
    assert not [shape for shape in _saved_shapes(chunked) if shape[-1:] == (4096,)]
    assert largest_chunked <= 4096 * 32  # the head's weight (V, H) is the largest
    assert [shape for shape in _saved_shapes(full) if shape[-1:] == (4096,)]


def test_a_head_with_unknown_extras_keeps_full_logits() -> None:
    """A softcap in the config that the model's forward does not apply (Llama ignores it):
    the two-token check sees different logits, and the scorer is refused."""
    assert token_scorer(tiny_model("llama"), None) is not None
    assert token_scorer(tiny_model("llama"), 0) is None
    assert token_scorer(tiny_model("llama", final_logit_softcapping=1.0), None) is None


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    options = {**_COMMON, **TINY["gemma3"], "vocab_size": 128}
    return save_tiny_model(tmp_path_factory.mktemp("tiny-gemma3"), options)


def test_engine_chunked_equals_full_logits(gemma_path: Path, one_rank: None) -> None:
    """An FSDP engine step and its log-probs are the same with chunks (the default, 3
    tokens, and with activation checkpointing) and with ``logprob_chunk_size=0`` (full
    logits), and equal plain transformers'."""
    config = EngineConfig(model=ModelConfig(path=str(gemma_path)), optim=OptimConfig(lr=1e-2))
    checkpointed = replace(config, fsdp=FSDPConfig(activation_checkpointing=True))
    results: dict[int | str | None, tuple[Any, ...]] = {}
    for chunk, base in ((None, config), (3, config), ("ac", checkpointed), (0, config)):
        size = None if chunk == "ac" else chunk
        engine = FSDPEngine(replace(base, logprob_chunk_size=size))
        assert (engine.scorer is None) == (chunk == 0)
        batch = make_toy_batch(6, seed=3)
        before = engine.compute_log_prob(batch)
        loss = engine.train_step(batch, toy_nll_loss)["loss"]
        results[chunk] = (loss, *before, *engine.compute_log_prob(batch, temperature=0.9))
    model = AutoModelForCausalLM.from_pretrained(gemma_path, dtype=torch.float32)
    batch = make_toy_batch(6, seed=3)
    mask = batch.batch["response_mask"].float()
    log_probs, _ = transformers_log_probs(model, batch)
    torch.testing.assert_close(results[None][1] * mask, log_probs * mask, atol=1e-5, rtol=0)
    for chunk in (None, 3, "ac"):
        assert results[chunk][0] == pytest.approx(results[0][0], abs=1e-5)
        for got, want in zip(results[chunk][1:], results[0][1:], strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    with pytest.raises(ConfigurationError, match="logprob_chunk_size=-1"):
        replace(config, logprob_chunk_size=-1)
