"""What the two GSM8K recipes share: their ``recipe:`` YAML section, the config loading,
and the train-then-export run (GRPO and PPO differ only in their YAML).

A recipe's YAML is an :class:`hf_algos.config.RLConfig` (the keys of
``docs/configuration.md``) plus one ``recipe:`` section of paths. The model directory and
the output folder are given once there; :func:`load_rl_config` copies them to every place
the trainer config needs them (actor, critic, log and checkpoint folders) unless those keys
were set explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_algos.config import RLConfig, load_config, load_mapping
from hf_algos.trainers import PPOTrainer
from hf_controller import ConfigurationError


@dataclass(frozen=True)
class RecipeSettings:
    """The ``recipe:`` section: where the model is and where the run writes."""

    model_path: str | None = None
    """Local Hugging Face model directory (weights and tokenizer), e.g. Qwen2.5-0.5B-Instruct."""
    output_dir: str = "outputs/gsm8k"
    """Logs (``logs/``), checkpoints (``checkpoints/``) and the final model (``model/``)."""


def get_path(raw: dict[str, Any], dotted: str) -> Any:
    """The value at ``a.b.c`` in nested dicts, or ``None`` when any level is missing."""
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def fill_defaults(raw: dict[str, Any], values: dict[str, Any]) -> list[str]:
    """``key=value`` overrides for each ``dotted key -> value`` not set in ``raw`` yet."""
    return [f"{key}={value}" for key, value in values.items() if get_path(raw, key) is None]


def check_data_files(raw: dict[str, Any]) -> None:
    """Missing data files are named with the command that makes them."""
    files = [*(get_path(raw, "data.train_files") or []), *(get_path(raw, "data.val_files") or [])]
    missing = [f for f in files if not Path(f).exists()]
    if missing:
        raise ConfigurationError(
            f"data files {missing} do not exist; make them from a local copy of GSM8K with "
            "`python -m recipes.gsm8k.prepare_data --src <gsm8k folder> --out data/gsm8k`, or "
            "set data.train_files / data.val_files"
        )


def load_rl_config(
    path: Path, overrides: Sequence[str], recipe_name: str
) -> tuple[RecipeSettings, RLConfig]:
    """The recipe's settings and its validated :class:`RLConfig` (YAML + overrides)."""
    raw = load_mapping(path, overrides)
    settings = load_config(RecipeSettings, base=raw.pop("recipe", None) or {})
    if settings.model_path is None:
        raise ConfigurationError(
            "recipe.model_path is not set; give a local model directory, e.g. `python -m "
            f"recipes.{recipe_name}.main recipe.model_path=/models/Qwen2.5-0.5B-Instruct`"
        )
    output = Path(settings.output_dir)
    fills = {
        "actor.engine.model.path": settings.model_path,
        "trainer.log_dir": output / "logs",
        "trainer.checkpoint_dir": output / "checkpoints",
    }
    if "critic" in raw:
        fills["critic.engine.model.path"] = settings.model_path
    check_data_files(raw)
    return settings, load_config(RLConfig, base=raw, overrides=fill_defaults(raw, fills))


def summarize(history: list[dict[str, float]], names: Sequence[str]) -> str:
    """First and last value of each metric in ``names`` that the run logged."""
    lines = []
    for name in names:
        values = [step[name] for step in history if name in step]
        if values:
            lines.append(f"  {name}: {values[0]:.4g} (first) -> {values[-1]:.4g} (last)")
    return "\n".join(lines)


def train_and_export(
    settings: RecipeSettings, config: RLConfig, reported: Sequence[str]
) -> list[dict[str, float]]:
    """Train ``config`` to the end, save the final actor to ``<output_dir>/model`` and print
    the first and last value of the ``reported`` metrics; returns every step's metrics."""
    model_dir = Path(settings.output_dir) / "model"
    with PPOTrainer(config) as trainer:
        history = trainer.fit()
        trainer.roles.actor.export_hf(str(model_dir))
    print(f"\n{len(history)} steps\n{summarize(history, reported)}\nmodel: {model_dir}")
    return history
