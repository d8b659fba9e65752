"""Stage ``grpo_real``: the SmolLM2-135M-Instruct GRPO recipe (``smollm2_chain_sum``) in the
hybrid placement on one device: vLLM rollout, FSDP2 actor, the local backend (no Ray).

Usage: ``python tools/gpu/grpo_real.py cuda|cpu MODEL STEPS OUT_DIR [vllm|native]``. On
``cuda``: the recipe's sizes, bf16 vLLM, FSDP2 bf16 mixed precision over fp32 master weights.
On ``cpu`` (the dry run): vLLM's CPU build, fp32, 2 prompts x 2 samples; ``native`` generates
with the native engine instead (the closed-set proof). Writes ``OUT_DIR/summary.json``:
per-phase seconds (median over the steps after the first), per-phase memory, validation.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from hf_algos.cli import main as hybridflow
from hf_algos.tracking.metrics import MEMORY_DEVICE, MEMORY_PEAK


def overrides(device: str, model: str, steps: int, out: Path, rollout: str = "vllm") -> list[str]:
    """The recipe's config, moved onto ``device`` and into ``out``, generating with the
    ``rollout`` backend (``native``: where there is no vLLM)."""
    common = [
        f"vars.workdir={out}",
        f"actor.engine.model.path={model}",
        "trainer.backend=local",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        "trainer.progress_bar=false",
        "trainer.export_dir=null",
        f"rollout.backend={rollout}",
    ]
    if device == "cuda":
        return [
            *common,
            "trainer.use_gpu=true",
            "rollout.dtype=bfloat16",  # the bundle's vLLM has FA3 attention only: no fp32
            "+rollout.engine_kwargs.gpu_memory_utilization=0.3",
            "+rollout.engine_kwargs.enforce_eager=true",  # no compile/graph capture minutes
            "actor.engine.fsdp.param_dtype=bfloat16",
        ]
    return [
        *common,
        "data.train_batch_size=2",
        "rollout.n=2",
        "rollout.max_new_tokens=16",
        "actor.ppo_mini_batch_size=4",
        'data.val_files=["reasoning_gym:${vars.task}&size=4&seed=2"]',
        "trainer.val_samples=2",
    ]


def summarize(metrics_file: Path) -> dict[str, Any]:
    """Per-phase median seconds (steps after the first: warm-up), per-phase peak memory,
    and the first and last validation metrics of a run's ``metrics.jsonl``."""
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    steps = [row for row in rows if any(key.startswith("timing_s/") for key in row)]
    later = steps[1:] or steps
    keys = sorted({key for row in steps for key in row})

    def median(key: str) -> float:
        return statistics.median(row[key] for row in later if key in row)

    def largest(prefix: str) -> dict[str, float]:
        """Per phase, the largest value of the ``<prefix><phase>`` entries over the steps."""
        return {
            k.removeprefix(prefix): max(r.get(k, 0.0) for r in steps)
            for k in keys
            if k.startswith(prefix)
        }

    vals = [row for row in rows if any(key.startswith("val/") for key in row)]
    return {
        "steps": len(steps),
        "seconds": {
            k.removeprefix("timing_s/"): median(k) for k in keys if k.startswith("timing_s/")
        },
        "first_step_seconds": steps[0].get("timing_s/step") if steps else None,
        "memory_peak_gib": largest(MEMORY_PEAK),
        "memory_device_gib": largest(MEMORY_DEVICE),
        "reward_mean": [row.get("critic/score/mean") for row in steps],
        "validation": [{k: v for k, v in row.items() if k.startswith("val/")} for row in vals],
    }


def main(device: str, model: str, steps: int, out_dir: str, rollout: str = "vllm") -> int:
    """Train; summarize the run's metrics; the command's exit code."""
    out = Path(out_dir)
    config = overrides(device, model, steps, out, rollout)
    code = hybridflow(["grpo", "--config-name", "smollm2_chain_sum", *config])
    found = sorted(out.glob("logs/**/metrics.jsonl"))
    if found:
        summary = {"exit": code, **summarize(found[-1])}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], *sys.argv[5:6]))
