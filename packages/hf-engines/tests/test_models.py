"""Model loading: the value head is deterministic in training mode."""

from __future__ import annotations

from pathlib import Path

import torch

from hf_engines import ModelConfig
from hf_engines.models import build_hf_model
from hf_engines.testing import build_tiny_model


def test_value_head_has_no_dropout_in_training_mode(tmp_path: Path) -> None:
    path = build_tiny_model(tmp_path / "model", family="qwen2")
    model = build_hf_model(ModelConfig(path=str(path), head="value"))
    model.train()
    ids = torch.randint(0, 100, (2, 9))
    first = model(input_ids=ids).logits
    second = model(input_ids=ids).logits
    torch.testing.assert_close(first, second, rtol=0, atol=0)
