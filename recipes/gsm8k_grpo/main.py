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

from collections.abc import Sequence
from pathlib import Path

from recipes.cli import parse_recipe_args
from recipes.gsm8k.recipe import load_rl_config, train_and_export

CONFIG_PATH = Path(__file__).with_name("config.yaml")

REPORTED = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "val/accuracy")
"""Metrics printed at the end (all of them are in the logs)."""


def run(overrides: Sequence[str] = (), config_path: Path = CONFIG_PATH) -> list[dict[str, float]]:
    """Train as the config says, save the final model; returns every step's metrics."""
    settings, config = load_rl_config(config_path, overrides, "gsm8k_grpo")
    return train_and_export(settings, config, REPORTED)


if __name__ == "__main__":  # the guard matters: vLLM starts its engine in subprocesses
    args = parse_recipe_args(__doc__, CONFIG_PATH)
    run(args.overrides, args.config)
