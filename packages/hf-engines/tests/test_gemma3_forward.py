"""Gemma 3 in the FSDP engine's forward: left padding, trimmed and packed rows, position ids.

The tiny ``gemma3`` model alternates a sliding-window layer (4 tokens, shorter than every
row here) with a global one, so a padding or packing mistake that shifts which tokens a
window sees changes the log-probs. Each mode must give what transformers gives for each
row alone, without any padding.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_engines import EngineConfig, FSDPEngine, ModelConfig
from hf_engines.config import MicroBatchConfig
from hf_engines.logprob import response_log_probs
from hf_engines.testing import make_toy_batch
from hf_protocol import DataProto

TEMPERATURE = 0.8


def row_by_row(model: torch.nn.Module, batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy of each row's response from a forward over that row's real
    tokens only (no padding, positions from 0); zero where the engine scores nothing."""
    responses, response_mask = batch.batch["responses"], batch.batch["response_mask"]
    log_probs, entropy = torch.zeros(responses.shape), torch.zeros(responses.shape)
    for row, (ids, real) in enumerate(
        zip(batch.batch["input_ids"], batch.batch["attention_mask"], strict=True)
    ):
        tokens = ids[real.bool()][None]
        length = int(response_mask[row].sum())
        with torch.no_grad():
            logits = model(input_ids=tokens).logits[:, -length - 1 : -1]
        row_lp, row_entropy = response_log_probs(
            logits, responses[row : row + 1, :length], TEMPERATURE
        )
        log_probs[row, :length], entropy[row, :length] = row_lp[0], row_entropy[0]
    return log_probs, entropy


@pytest.mark.parametrize("mode", ["off", "trim", "pack"])
def test_engine_log_probs_equal_transformers_row_by_row(
    tiny_models: dict[str, Path], one_rank: None, mode: str
) -> None:
    path = tiny_models["gemma3"]
    batch = make_toy_batch(6, prompt_length=9, response_length=7, seed=5)
    assert int(batch.batch["attention_mask"].sum(dim=1).min()) > 4  # longer than the window
    config = EngineConfig(
        model=ModelConfig(path=str(path), remove_padding=mode),  # type: ignore[arg-type]
        micro_batch=MicroBatchConfig(micro_batch_size=3),
    )
    engine = FSDPEngine(config)
    log_probs, entropy = engine.compute_log_prob(batch, temperature=TEMPERATURE)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    expected_lp, expected_entropy = row_by_row(model, batch)
    mask = batch.batch["response_mask"].bool()
    assert mask.sum() > 0 and log_probs.shape == mask.shape
    torch.testing.assert_close(log_probs[mask], expected_lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy[mask], expected_entropy[mask], atol=1e-5, rtol=0)
