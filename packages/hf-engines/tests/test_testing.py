"""Tiny local models, the toy batch layout, the rank launcher and model building."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_engines import ModelConfig
from hf_engines.models import build_hf_model, transformer_blocks
from hf_engines.testing import build_tiny_model, launch_ranks, make_toy_batch
from hf_protocol.testing import TINY_DECODER_CONFIGS


@pytest.mark.parametrize("family", sorted(TINY_DECODER_CONFIGS))
def test_tiny_models_load_from_their_directory(tiny_models: dict[str, Path], family: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_models[family], local_files_only=True)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    assert len(transformer_blocks(model)) == 2


def test_same_seed_same_weights(tmp_path: Path) -> None:
    first = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", seed=5))
    second = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", seed=5))
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match=r"'gpt2'.*choose from"):
        build_tiny_model(tmp_path / "c", "gpt2")


def test_random_init_from_hf_config_is_seeded() -> None:
    config = ModelConfig(hf_config=TINY_DECODER_CONFIGS["llama"], seed=1)
    first, second = build_hf_model(config), build_hf_model(config)
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b)


def test_toy_batch_layout() -> None:
    batch = make_toy_batch(6, prompt_length=5, response_length=4, seed=3).batch
    prompt_mask = batch["attention_mask"][:, :5]
    response_mask = batch["response_mask"]
    # Prompts left-padded, responses right-padded: masks are monotone in opposite senses.
    assert torch.all(prompt_mask[:, 1:] >= prompt_mask[:, :-1])
    assert torch.all(response_mask[:, 1:] <= response_mask[:, :-1])
    assert torch.equal(batch["attention_mask"][:, 5:], response_mask)
    ids = batch["input_ids"][batch["attention_mask"].bool()]
    assert torch.all(ids > 0)
    first_real = batch["position_ids"][batch["attention_mask"].bool()]
    assert int(first_real.min()) == 0


def test_launch_ranks_reports_the_failing_rank(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    rank = "int(os.environ['RANK'])"
    script.write_text(f"import os, sys\nprint('hello from', {rank})\nsys.exit({rank} * 3)\n")
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 of 2 exited with code 3.*hello from 1"):
        launch_ranks(script, 2, timeout=30)
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(RuntimeError, match=r"timed out"):
        launch_ranks(sleeper, 1, timeout=1)


def test_free_port_is_below_the_ephemeral_range() -> None:
    from hf_controller.worker import RENDEZVOUS_PORTS
    from hf_engines.testing import free_port

    low, high = RENDEZVOUS_PORTS
    high = min(high, int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]))
    assert low <= free_port() < high
