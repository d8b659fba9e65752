"""Gemma 3 (``gemma3_text``) through the native backend, checked against transformers.

Left padding, a sliding window shorter than the prompts and a ``DynamicCache`` whose
sliding layers keep only their last window is the risky combination; the checks below
cover it with a batch of 32 prompts, ``n`` samples per prompt (cache rows repeated) and
finished rows dropped from the cache. Any deprecation warning from transformers during
generation is an error: the rollout must call its current API.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

from hf_engines.logprob import response_log_probs, response_positions
from hf_protocol import DataProto
from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.testing import build_tiny_model, make_prompts, random_prompt_ids

PAD = 0
VOCAB = 512
WINDOW = 4
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3: hidden 64, 4 layers (3 with a 4-token window), vocab 512, tied."""
    return build_tiny_model(
        tmp_path_factory.mktemp("gemma3") / "model",
        "gemma3",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        layer_types=LAYER_TYPES,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=WINDOW,
        vocab_size=VOCAB,
    )


@pytest.fixture(scope="module")
def prompts() -> DataProto:
    """32 left-padded prompts of 2 to 14 tokens (most longer than the window)."""
    return make_prompts(random_prompt_ids(32, 2, 14, vocab_size=VOCAB, seed=1), PAD)


def reference_model(path: Path, **overrides: object) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **overrides).eval()


def transformers_greedy(model: torch.nn.Module, prompts: DataProto, steps: int) -> torch.Tensor:
    ids = prompts.batch["input_ids"]
    out = model.generate(  # type: ignore[operator]
        input_ids=ids,
        attention_mask=prompts.batch["attention_mask"],
        do_sample=False,
        max_new_tokens=steps,
        eos_token_id=VOCAB + 1,  # never sampled: every row runs all the steps
        pad_token_id=PAD,
    )
    return out[:, ids.shape[1] :]


def generate_strictly(
    engine: NativeRollout, prompts: DataProto, sampling: SamplingConfig
) -> DataProto:
    """``engine.generate`` with every warning (deprecated transformers API...) an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return engine.generate(prompts, sampling)


def test_the_window_is_real(gemma3: Path, prompts: DataProto) -> None:
    model = reference_model(gemma3)
    cache = DynamicCache(config=model.config)  # type: ignore[attr-defined]
    kinds = [type(layer) is DynamicSlidingWindowLayer for layer in cache.layers]
    assert kinds == [kind == "sliding_attention" for kind in LAYER_TYPES]
    assert int(prompts.batch["attention_mask"].sum(dim=1).max()) > 2 * WINDOW
    # Without the window the same weights continue differently: the window matters here.
    wide = reference_model(gemma3, sliding_window=64)
    windowed = transformers_greedy(model, prompts, 8)
    assert not torch.equal(windowed, transformers_greedy(wide, prompts, 8))


def full_forward_logits(path: Path, batch: Any) -> torch.Tensor:
    """transformers' logits of every position of a generated batch, in one forward."""
    with torch.no_grad():
        return reference_model(path)(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits


def assert_rollout_log_probs(batch: Any, logits: torch.Tensor, temperature: float) -> None:
    """The rollout's log-probs of its response tokens equal those of ``logits``."""
    responses = batch["responses"]
    expected, _ = response_log_probs(
        response_positions(logits, responses.shape[1]), responses, temperature=temperature
    )
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(batch["rollout_log_probs"][mask], expected[mask], atol=1e-4, rtol=0)


def engine_for(path: Path, lean: bool, compact_fraction: float) -> NativeRollout:
    options = {"compact_fraction": compact_fraction, "lean_forward": lean}
    return NativeRollout(
        RolloutConfig(model_path=str(path), pad_token_id=PAD, engine_kwargs=options)
    )


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers-forward"])
@pytest.mark.parametrize("n", [1, 3])
def test_greedy_equals_transformers_generate(
    gemma3: Path, prompts: DataProto, n: int, lean: bool, caplog: pytest.LogCaptureFixture
) -> None:
    reference = transformers_greedy(reference_model(gemma3), prompts, 12)
    # A stop token that ends some rows early, so finished rows leave the cache.
    stop = int(reference[:, :6].flatten().mode().values)
    with caplog.at_level(logging.INFO, logger="hf_rollout.backends.native"):
        engine = engine_for(gemma3, lean, compact_fraction=0.1)
    assert (engine.decoder is not None) == lean
    path = "the lean decoder" if lean else "the transformers forward (no lean decoder: lean_forward"
    paths = [r.message for r in caplog.records if r.message.startswith("native rollout:")]
    assert len(paths) == 1 and paths[0].startswith(f"native rollout: gemma3_text through {path}")
    sampling = SamplingConfig(greedy=True, n=n, max_new_tokens=12, stop_token_ids=(stop,))
    out = generate_strictly(engine, prompts, sampling)
    responses, mask = out.batch["responses"], out.batch["response_mask"].bool()
    expected = reference.repeat_interleave(n, dim=0)[:, : responses.shape[1]]
    assert torch.equal(responses[mask], expected[mask])
    stopped = (responses == stop).any(dim=1)
    assert stopped.any() and not stopped.all()
    # Every row is transformers' tokens up to and including its stop token, then padding.
    first_stop = (expected == stop).long().argmax(dim=1)
    lengths = torch.where((expected == stop).any(dim=1), first_stop + 1, expected.shape[1])
    assert torch.equal(mask.sum(dim=1), lengths)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers-forward"])
def test_log_probs_match_a_full_forward(gemma3: Path, prompts: DataProto, lean: bool) -> None:
    engine = engine_for(gemma3, lean, compact_fraction=0.25)
    budget = 16
    sampling = SamplingConfig(
        n=4, temperature=0.8, top_p=0.95, max_new_tokens=budget, seed=3,
        stop_token_ids=tuple(range(3, 60)),
    )  # fmt: skip
    out = generate_strictly(engine, prompts, sampling)
    lengths = out.batch["response_mask"].sum(dim=1)
    assert out.batch["responses"].shape[0] == 4 * 32
    # At least a quarter of the rows stopped two steps before the end: the cache was compacted.
    assert (lengths <= budget - 2).float().mean() >= 0.25
    batch = out.batch
    assert_rollout_log_probs(batch, full_forward_logits(gemma3, batch), temperature=0.8)
    assert (batch["rollout_log_probs"][~batch["response_mask"].bool()] == 0).all()


def test_final_logit_soft_capping_is_applied(tmp_path: Path, prompts: DataProto) -> None:
    # A cap of 2 squeezes every logit: a decoder that skipped it would differ at once.
    path = build_tiny_model(
        tmp_path / "capped", "gemma3", vocab_size=VOCAB, final_logit_softcapping=2.0
    )
    engine = engine_for(path, lean=True, compact_fraction=0.5)
    assert engine.decoder is not None
    sampling = SamplingConfig(n=2, temperature=1.0, max_new_tokens=6, seed=4)
    out = generate_strictly(engine, prompts, sampling)
    batch = out.batch
    logits = full_forward_logits(path, batch)
    assert logits.abs().max() <= 2.0
    assert_rollout_log_probs(batch, logits, temperature=1.0)


def test_prefix_reuse_is_off_for_a_sliding_window_model(
    gemma3: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for lean in (True, False):
        options = {"lean_forward": lean}
        config = RolloutConfig(
            model_path=str(gemma3), pad_token_id=PAD, prefix_cache_rows=8, engine_kwargs=options
        )
        with caplog.at_level(logging.WARNING, logger="hf_rollout.backends.native"):
            assert NativeRollout(config).prefix_cache is None
    assert sum("prefix_cache_rows=8 ignored" in r.message for r in caplog.records) == 2
