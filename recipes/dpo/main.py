"""Offline DPO: learn from a local dataset of (prompt, chosen, rejected) pairs.

What it really is, one step: 64 pairs become 128 rows (chosen and rejected next to each
other); the frozen reference model gives each response's log-probability, and the policy
takes one optimizer step on ``-log sigmoid(beta * margin)``, the margin being how much more
the policy raised the chosen response's log-probability over the reference than the
rejected one's. Every 25 steps, the share of held-out pairs whose margin is positive
(``val/dpo/reward_accuracy``) is measured.

With no model and no data given it makes a tiny random model and a generated
letter-reversal preference set, and runs on CPU in under a minute::

    python -m recipes.dpo.main
    python -m recipes.dpo.main recipe.model_path=/models/my-model data.train_files=[prefs.jsonl]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_algos.config import DPOConfig, load_config, load_mapping
from hf_algos.data import build_char_tokenizer
from hf_algos.trainers import DPOTrainer
from hf_engines.testing import build_tiny_model
from recipes.cli import parse_recipe_args
from recipes.dpo.synthetic import write_preference_files

CONFIG_PATH = Path(__file__).with_name("config.yaml")

VAL_ACCURACY = "val/dpo/reward_accuracy"
"""Share of held-out pairs whose implicit-reward margin is positive."""


@dataclass(frozen=True)
class RecipeSettings:
    """The ``recipe:`` section: the model, the output folder, the generated data's size."""

    model_path: str | None = None
    """Local Hugging Face model directory with its tokenizer; ``None`` makes a tiny one."""
    workdir: str = "outputs/dpo"
    """Logs, checkpoints, the final model, and whatever the recipe generates."""
    synthetic_pairs: int = 2048
    """Training pairs generated when ``data.train_files`` is empty."""


def fill_in(raw: dict[str, Any], settings: RecipeSettings) -> list[str]:
    """Overrides setting the model, data and output paths the recipe provides."""
    workdir = Path(settings.workdir)
    model_path = settings.model_path
    if model_path is None:
        model_path = str(build_tiny_model(workdir / "tiny_model", "qwen2"))
        build_char_tokenizer(model_path, chat_template=None)
    trainer = raw.get("trainer") or {}
    fills = [
        f"actor.engine.model.path={model_path}",
        f"trainer.log_dir={trainer.get('log_dir') or workdir / 'logs'}",
        f"trainer.checkpoint_dir={trainer.get('checkpoint_dir') or workdir / 'checkpoints'}",
    ]
    if not raw.get("data", {}).get("train_files"):
        train, val = write_preference_files(workdir / "data", settings.synthetic_pairs, 64)
        fills += [f"data.train_files=[{train}]", f"data.val_files=[{val}]"]
    return fills


def load_dpo_config(path: Path, overrides: Sequence[str]) -> tuple[RecipeSettings, DPOConfig]:
    """The recipe's settings and its validated :class:`DPOConfig` (YAML + overrides); makes
    the tiny model and the generated pairs first when the config names none."""
    raw = load_mapping(path, overrides)
    settings = load_config(RecipeSettings, base=raw.pop("recipe", None) or {})
    return settings, load_config(DPOConfig, base=raw, overrides=fill_in(raw, settings))


def run(overrides: Sequence[str] = (), config_path: Path = CONFIG_PATH) -> list[dict[str, float]]:
    """Train as the config says, save the final model; returns every step's metrics."""
    settings, config = load_dpo_config(config_path, overrides)
    model_dir = Path(settings.workdir) / "model"
    with DPOTrainer(config) as trainer:
        history = trainer.fit()
        trainer.roles.actor.export_hf(str(model_dir))
        trainer.tokenizer.save_pretrained(model_dir)
    accuracy = [step[VAL_ACCURACY] for step in history if VAL_ACCURACY in step]
    if accuracy:
        print(f"held-out pairs ranked right by the implicit reward: {accuracy[-1]:.2f}")
    print(f"{len(history)} steps; model: {model_dir}; metrics: {config.trainer.log_dir}")
    return history


if __name__ == "__main__":
    args = parse_recipe_args(__doc__, CONFIG_PATH)
    run(args.overrides, args.config)
