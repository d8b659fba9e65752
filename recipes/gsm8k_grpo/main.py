"""GRPO on GSM8K: Qwen2.5-0.5B-Instruct learns to answer grade-school maths with "#### n".

What it really is: every step takes 256 questions, samples 5 answers each with vLLM, scores
each answer 1 or 0 by whether the number after its last ``####`` is right, and normalises
the scores within each question's group of 5 into advantages (no critic). The FSDP2 actor
then takes clipped policy-gradient steps on them, with a small KL loss to a frozen copy of
the initial model, and hands its new weights to vLLM in the same process. Greedy accuracy
on the 1319 test questions is logged every 10 steps.

Run from the repository root after preparing the data (see README.md)::

    python -m recipes.gsm8k_grpo.main recipe.model_path=/models/Qwen2.5-0.5B-Instruct
    python -m recipes.gsm8k_grpo.main recipe.model_path=... trainer.n_workers=8 rollout.n=8
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from hf_algos.trainers import PPOTrainer
from recipes.gsm8k.recipe import load_rl_config, summarize

CONFIG_PATH = Path(__file__).with_name("config.yaml")

REPORTED = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "val/accuracy")
"""Metrics printed at the end (all of them are in the logs)."""


def run(overrides: Sequence[str] = (), config_path: Path = CONFIG_PATH) -> list[dict[str, float]]:
    """Train as the config says, save the final model; returns every step's metrics."""
    settings, config = load_rl_config(config_path, overrides, "gsm8k_grpo")
    model_dir = Path(settings.output_dir) / "model"
    with PPOTrainer(config) as trainer:
        history = trainer.fit()
        trainer.roles.actor.export_hf(str(model_dir))
    print(f"\n{len(history)} steps\n{summarize(history, REPORTED)}\nmodel: {model_dir}")
    return history


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command line: an optional config file and ``key.sub=value`` overrides."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG_PATH, help="recipe YAML file")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides of the YAML")
    return parser.parse_args(argv)


if __name__ == "__main__":  # the guard matters: vLLM starts its engine in subprocesses
    args = parse_args()
    run(args.overrides, args.config)
