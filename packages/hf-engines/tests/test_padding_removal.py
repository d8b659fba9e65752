"""Skipping padding (trim, pack) gives the padded path's outputs, gradients and steps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hf_engines import (
    EngineConfig,
    FSDPEngine,
    ModelConfig,
    entropy_from_logits,
    logprobs_from_logits,
)
from hf_engines.config import MicroBatchConfig, OptimConfig
from hf_engines.fsdp.forward import forward_micro_batch
from hf_engines.fsdp.outputs import token_log_probs
from hf_engines.fsdp.unpad import choose_padding_mode, pack_rows, scored_response_mask, trim_window
from hf_engines.models import build_hf_model
from hf_engines.testing import make_toy_batch, toy_nll_loss
from hf_protocol import DataProto

MODES = ("off", "trim", "pack")


def batch() -> DataProto:
    return make_toy_batch(6, prompt_length=8, response_length=6, seed=4)


def split(data: DataProto) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    tensors = data.batch
    inputs = {k: tensors[k] for k in ("input_ids", "attention_mask", "position_ids")}
    return inputs, tensors["responses"]


def test_auto_mode_packs_only_for_flash_attention() -> None:
    assert choose_padding_mode("flash_attention_2") == "pack"
    assert choose_padding_mode("sdpa") == "trim"
    assert choose_padding_mode("eager") == "trim"
    assert choose_padding_mode("sdpa", "pack") == "pack"
    assert choose_padding_mode("flash_attention_2", "off") == "off"


def test_trim_window_keeps_the_used_columns() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 0]])
    assert trim_window(mask, response_length=3) == (2, 6)
    assert trim_window(torch.zeros(2, 7, dtype=torch.long), 3) == (3, 5)  # nothing used


def test_pack_rows_refuses_positions_it_cannot_delimit() -> None:
    inputs, _ = split(batch())
    packed = pack_rows(inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"], 6)
    assert packed is not None
    assert packed.input_ids.shape == (1, int(inputs["attention_mask"].sum()))
    assert len(packed.rows) == int(scored_response_mask(inputs["attention_mask"], 6).sum())
    shifted = inputs["position_ids"] + 3  # sequences not starting at 0: restarts are ambiguous
    assert pack_rows(inputs["input_ids"], inputs["attention_mask"], shifted, 6) is None


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("head", ["causal_lm", "value"])
def test_modes_agree_on_outputs_and_gradients(
    tiny_models: dict[str, Path], family: str, head: str
) -> None:
    model = build_hf_model(ModelConfig(path=str(tiny_models[family]), head=head))  # sdpa
    inputs, responses = split(batch())
    scored = scored_response_mask(inputs["attention_mask"], responses.shape[1])
    keys = ("values",) if head == "value" else ("log_probs", "entropy")
    results = {}
    for mode in MODES:
        model.zero_grad()
        outputs = forward_micro_batch(model, inputs, responses, head == "value", 0.7, mode)
        tensors = {key: outputs[key] for key in keys}  # type: ignore[literal-required]
        (tensors[keys[0]] * scored).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[mode] = (tensors, grads)
    reference_outputs, reference_grads = results["off"]
    for mode in ("trim", "pack"):
        tensors, grads = results[mode]
        for key, value in tensors.items():
            torch.testing.assert_close(value, reference_outputs[key], atol=1e-5, rtol=1e-5)
            assert value[~scored].eq(0).all()
        assert grads.keys() == reference_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, reference_grads[name], atol=1e-5, rtol=1e-4)


def test_entropy_is_computed_only_when_read() -> None:
    logits = torch.randn(3, 4, 50, requires_grad=True)
    targets = torch.randint(0, 50, (3, 4))
    outputs = token_log_probs(logits, targets, temperature=0.8)
    assert list(outputs) == ["log_probs"] and "entropy" in outputs  # lazy until read
    torch.testing.assert_close(outputs["log_probs"], logprobs_from_logits(logits / 0.8, targets))
    entropy = outputs["entropy"]
    torch.testing.assert_close(entropy, entropy_from_logits(logits / 0.8), atol=1e-5, rtol=1e-5)
    entropy.sum().backward()  # an entropy bonus still trains
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_engine_steps_equal_across_modes(tiny_models: dict[str, Path], one_rank: None) -> None:
    config = EngineConfig(
        model=ModelConfig(path=str(tiny_models["qwen2"])),
        optim=OptimConfig(lr=1e-2),
        micro_batch=MicroBatchConfig(micro_batch_size=3),
    )
    results = {}
    for mode in MODES:
        engine = FSDPEngine(replace(config, model=replace(config.model, remove_padding=mode)))
        assert engine.padding_mode == mode
        loss = engine.train_step(batch(), toy_nll_loss)["loss"]
        log_probs, entropy = engine.compute_log_prob(batch(), temperature=0.9)
        results[mode] = (loss, log_probs, entropy)
    for mode in ("trim", "pack"):
        assert results[mode][0] == pytest.approx(results["off"][0], abs=1e-5)
        torch.testing.assert_close(results[mode][1], results["off"][1], atol=1e-5, rtol=0)
        torch.testing.assert_close(results[mode][2], results["off"][2], atol=1e-5, rtol=0)
