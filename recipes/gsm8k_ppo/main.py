"""PPO on GSM8K: Qwen2.5-0.5B-Instruct with a learned critic, the classic RLHF loop.

What it really is: every step takes 256 questions, samples one answer each with vLLM and
scores it 1 or 0 (the number after its last ``####``); the score, minus a small KL penalty
to a frozen copy of the initial model, is the reward on the answer's last token. A critic (a
value head on another copy of the model) estimates each token's value, GAE turns rewards and
values into advantages, then the critic regresses on the returns and the actor takes clipped
policy-gradient steps. The new actor weights go to vLLM in the same process.

Run from the repository root after preparing the data (see README.md)::

    python -m recipes.gsm8k_ppo.main recipe.model_path=/models/Qwen2.5-0.5B-Instruct
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from recipes.cli import parse_recipe_args
from recipes.gsm8k.recipe import load_rl_config, train_and_export

CONFIG_PATH = Path(__file__).with_name("config.yaml")

REPORTED = ("critic/score/mean", "actor/pg_loss", "critic/vf_loss", "val/accuracy")
"""Metrics printed at the end (all of them are in the logs)."""


def run(overrides: Sequence[str] = (), config_path: Path = CONFIG_PATH) -> list[dict[str, float]]:
    """Train as the config says, save the final actor; returns every step's metrics."""
    settings, config = load_rl_config(config_path, overrides, "gsm8k_ppo")
    return train_and_export(settings, config, REPORTED)


if __name__ == "__main__":  # the guard matters: vLLM starts its engine in subprocesses
    args = parse_recipe_args(__doc__, CONFIG_PATH)
    run(args.overrides, args.config)
