"""Every shipped recipe config builds and validates, without starting a worker.

The configs are found by glob (``recipes/*/config*.yaml``), so a new recipe's config is
collected automatically; it fails here until its loader is added to :data:`LOADERS`. Each
loader goes through the recipe's own loading code (its dataclasses, its ``recipe:`` section,
its fill-ins), so a key the recipe no longer understands, a batch size that no longer
divides or a section the trainer would refuse fails in seconds, not at the start of a run.

Placeholders: some configs name files that exist only after a data-prep step (GSM8K's
parquet files) or that the recipe makes when it runs (a tiny model, generated data). The
checks only test that those paths exist (``model.path`` must hold a ``config.json``), so the
loaders point them, through overrides, at empty files and a model directory holding an empty
``config.json`` in ``tmp_path``. Every other key is validated as shipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from hf_algos.config import RLConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(REPO_ROOT.glob("recipes/*/config*.yaml"))


def placeholder_model(root: Path) -> Path:
    """A directory that passes the config-time model check (it holds a ``config.json``)."""
    model = root / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return model


def placeholder_file(root: Path, name: str) -> Path:
    """An empty file: data paths are only checked for existence when a config is built."""
    path = root / "data" / name
    path.parent.mkdir(exist_ok=True)
    path.touch()
    return path


def gsm8k_overrides(root: Path) -> list[str]:
    """The model and the data files that ``recipes.gsm8k.prepare_data`` would make."""
    train, test = placeholder_file(root, "train.parquet"), placeholder_file(root, "test.parquet")
    return [
        f"recipe.model_path={placeholder_model(root)}",
        f"recipe.output_dir={root / 'out'}",
        f"data.train_files=[{train}]",
        f"data.val_files=[{test}]",
    ]


def load_gsm8k(path: Path, root: Path) -> list[object]:
    """``recipe:`` settings and the :class:`RLConfig`, as ``recipes.gsm8k_*.main`` loads them."""
    from recipes.gsm8k.recipe import load_rl_config

    settings, config = load_rl_config(path, gsm8k_overrides(root), path.parent.name)
    return [settings, config]


def load_quickstart(path: Path, root: Path) -> list[object]:
    """Task, model shape, and the SFT, GRPO and PPO stage configs, as ``run_quickstart``
    builds them (``algo=grpo`` / ``algo=ppo``)."""
    from hf_algos.config import load_config
    from hf_algos.examples.reverse_letters import ModelShape, TaskConfig
    from recipes.quickstart.main import load_recipe_config, rl_config, sft_config

    raw = load_recipe_config(path, [f"workdir={root}"])
    task = load_config(TaskConfig, base=raw.get("task", {}))
    shape = load_config(ModelShape, base=raw.get("model", {}))
    # The recipe makes the model and the task files before building the stage configs.
    files = {name: placeholder_file(root, f"{name}.jsonl") for name in ("sft", "train", "val")}
    model = placeholder_model(root)
    stages = [rl_config(raw, root, model, files, algo) for algo in ("grpo", "ppo")]
    return [task, shape, sft_config(raw, root, model, files), *stages]


def load_dpo(path: Path, root: Path) -> list[object]:
    """``recipe:`` settings and the :class:`DPOConfig`, through the recipe's loader."""
    from recipes.dpo.main import load_dpo_config

    # With no model or pairs given, the recipe would make a tiny model and generate pairs.
    overrides = [
        f"recipe.model_path={placeholder_model(root)}",
        f"recipe.workdir={root}",
        f"data.train_files=[{placeholder_file(root, 'train.jsonl')}]",
        f"data.val_files=[{placeholder_file(root, 'val.jsonl')}]",
    ]
    settings, config = load_dpo_config(path, overrides)
    return [settings, config]


def load_online_dpo(path: Path, root: Path) -> list[object]:
    """The recipe's own config, then the actor, reference and rollout configs of its roles."""
    from recipes.online_dpo.main import load_online_dpo_config, role_configs

    config = load_online_dpo_config(path, [f"workdir={root}"])
    # run() makes the tiny model (model_path: null) and reads the pad id from its tokenizer.
    roles = role_configs(config, str(placeholder_model(root)), pad_token_id=0)
    return [config, *roles]


def load_tool_calc(path: Path, root: Path) -> list[object]:
    """Task, model shape, and each arm's SFT and GRPO configs, as ``run_tool_calc`` builds them."""
    from hf_algos.config import load_config
    from hf_algos.examples.reverse_letters import ModelShape
    from recipes.tool_calc.main import arm_configs, load_recipe_config
    from recipes.tool_calc.task import TaskConfig

    raw = load_recipe_config(path, [f"workdir={root}"])
    task = load_config(TaskConfig, base=raw.get("task", {}))
    shape = load_config(ModelShape, base=raw.get("model", {}))
    names = ("train", "val", "sft_tool", "sft_direct")
    files = {name: placeholder_file(root, f"{name}.jsonl") for name in names}
    model = placeholder_model(root)
    stages = [config for arm in raw["arms"] for config in arm_configs(raw, arm, root, model, files)]
    return [task, shape, *stages]


LOADERS: dict[str, Callable[[Path, Path], list[object]]] = {
    "dpo": load_dpo,
    "gsm8k_grpo": load_gsm8k,
    "gsm8k_ppo": load_gsm8k,
    "online_dpo": load_online_dpo,
    "quickstart": load_quickstart,
    "tool_calc": load_tool_calc,
}
"""Recipe directory -> ``loader(config_path, tmp_path)`` returning the config objects it built."""


def config_id(path: Path) -> str:
    """The test id: the config's path from the repository root."""
    return str(path.relative_to(REPO_ROOT))


def test_every_recipe_directory_with_a_loader_has_a_config() -> None:
    assert {path.parent.name for path in CONFIGS} >= set(LOADERS)


@pytest.mark.parametrize("path", CONFIGS, ids=config_id)
def test_recipe_config_builds_and_validates(path: Path, tmp_path: Path) -> None:
    loader = LOADERS.get(path.parent.name)
    assert loader is not None, (
        f"no loader for {config_id(path)}: add one to LOADERS in {Path(__file__).name} that "
        "builds the recipe's config objects the way its main.py does"
    )
    built = loader(path, tmp_path)
    assert built and all(dataclasses.is_dataclass(c) for c in built)


@pytest.mark.parametrize("recipe", ["gsm8k_grpo", "gsm8k_ppo"])
@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_gpu_configs_validate_for_common_gpu_counts(recipe: str, gpus: int, tmp_path: Path) -> None:
    from recipes.gsm8k.recipe import load_rl_config

    path = REPO_ROOT / "recipes" / recipe / "config.yaml"
    overrides = [*gsm8k_overrides(tmp_path), f"trainer.n_workers={gpus}"]
    _, config = load_rl_config(path, overrides, recipe)
    assert isinstance(config, RLConfig)
    assert config.rollout.backend == "vllm" and config.trainer.use_gpu
    assert config.actor.engine.fsdp.param_dtype == "bfloat16"
