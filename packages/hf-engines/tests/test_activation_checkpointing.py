"""``fsdp.activation_checkpointing`` recomputes each block in backward, from the first
training step on.

``from_pretrained`` leaves a model in eval mode, and transformers only checkpoints in
training mode: before the engine set training mode itself, a run whose first forward was
a training step (no forward-only pass before it, as with ``use_rollout_log_probs``) held
every block's activations and its peak memory did not move with the setting.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from hf_engines import FSDPEngine
from hf_engines.config import EngineConfig, FSDPConfig, ModelConfig, OptimConfig
from hf_engines.testing import build_tiny_model, make_toy_batch, toy_nll_loss


def block_calls(engine: FSDPEngine) -> list[int]:
    """A list that counts the calls of the engine's first decoder layer's MLP."""
    calls = [0]

    def count(module: torch.nn.Module, args: object) -> None:
        calls[0] += 1

    # transformers checkpoints a layer's forward, not its __call__: count a submodule's.
    engine.model.model.layers[0].mlp.register_forward_pre_hook(count)  # a tiny Llama
    return calls


@pytest.mark.parametrize("checkpointing", [True, False])
def test_first_training_step_recomputes_blocks(
    checkpointing: bool, tmp_path: Path, one_rank: None
) -> None:
    """The first call of a fresh engine is ``train_step``: a block runs twice (forward,
    then recomputed in backward) with checkpointing, once without."""
    path = build_tiny_model(tmp_path / "tiny")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = FSDPEngine(
            EngineConfig(
                model=ModelConfig(path=str(path)),
                optim=OptimConfig(lr=1e-3),
                fsdp=FSDPConfig(activation_checkpointing=checkpointing),
            )
        )
        calls = block_calls(engine)
        engine.train_step(make_toy_batch(4, seed=1), toy_nll_loss)
    assert calls[0] == (2 if checkpointing else 1)
    # The switch is transformers' current one: its deprecated alias warns on every run.
    deprecated = [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    assert deprecated == []
