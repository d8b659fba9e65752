"""recipes/quickstart with LoRA on for the GRPO stage (after the full-weight SFT warm-up).

Only the rank-16 adapters of every linear layer train (17 % of the parameters, 17 % of the
AdamW state; docs/lora.md), the hybrid rollout gets the merged weights after every update,
and the final export is a merged Hugging Face model. Measured with these settings (2 shared
CPU cores): the mean reward of a step rises from 0.15 to 0.26-0.29 over 300 steps; held-out
exact-match accuracy is still in the dip the full-weight run shows before it climbs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

REPO_ROOT = Path(__file__).resolve().parents[2]
LORA = [
    "grpo.actor.lora.rank=16",
    "grpo.actor.lora.alpha=32",
    "grpo.actor.engine.optim.lr=2e-3",
    "grpo.trainer.total_training_steps=300",
    "grpo.trainer.progress_bar=false",
    "sft.trainer.progress_bar=false",
]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_quickstart_learns_with_lora(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    command = [sys.executable, "-m", "recipes.quickstart.main", f"workdir={tmp_path}", *LORA]
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1450
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "logs" / "grpo.jsonl").open()]
    scores = [r["critic/score/mean"] for r in records if "critic/score/mean" in r]
    first, last = sum(scores[:25]) / 25, sum(scores[-25:]) / 25
    assert last > first + 0.05, f"LoRA GRPO did not raise the reward: {first:.3f} -> {last:.3f}"
    # the export is the merged model: a plain transformers directory, no adapter files
    model_dir = tmp_path / "model_grpo"
    assert not (model_dir / "adapter_config.json").exists()
    AutoModelForCausalLM.from_pretrained(model_dir)
