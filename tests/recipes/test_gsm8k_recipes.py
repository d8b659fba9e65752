"""recipes/gsm8k, gsm8k_grpo and gsm8k_ppo: data preparation, and 2-step CPU runs of the GPU
configs (native rollout, one Ray worker, a tiny random Qwen2 and a character tokenizer). The
GPU configs themselves, for 1-8 GPUs, are validated in test_recipe_configs.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_algos.data import read_rows, write_rows
from hf_algos.rewards import SCORING_FUNCTIONS
from hf_controller import ConfigurationError
from recipes.gsm8k.prepare_data import DATA_SOURCE, prepare_gsm8k
from recipes.gsm8k.synthetic import CPU_OVERRIDES, build_tiny_setup

PPO_CPU_OVERRIDES = (
    "critic.ppo_mini_batch_size=4",
    "critic.engine.micro_batch.micro_batch_size=2",
    "critic.engine.fsdp.param_dtype=float32",
    "critic.engine.fsdp.activation_checkpointing=false",
)


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny model and prepared synthetic GSM8K data, made once for the module."""
    return build_tiny_setup(tmp_path_factory.mktemp("gsm8k"))


def cpu_overrides(model: Path, data: Path, out: Path) -> list[str]:
    """The tiny setup's paths plus the CPU overrides."""
    return [
        f"recipe.model_path={model}",
        f"recipe.output_dir={out}",
        f"data.train_files=[{data / 'train.parquet'}]",
        f"data.val_files=[{data / 'test.parquet'}]",
        *CPU_OVERRIDES,
    ]


# ---------------------------------------------------------------------- data preparation


def test_prepare_data_from_hf_parquet_layout(tiny_setup: tuple[Path, Path]) -> None:
    _, data = tiny_setup
    train, test = read_rows(data / "train.parquet"), read_rows(data / "test.parquet")
    assert (len(train), len(test)) == (32, 4)
    row = train[0]
    assert row["data_source"] == DATA_SOURCE
    assert row["prompt"][0]["role"] == "user"
    assert row["prompt"][0]["content"].startswith(row["extra_info"]["question"])
    assert "####" in row["prompt"][0]["content"]
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0
    truth = row["reward_model"]["ground_truth"]
    assert row["extra_info"]["answer"].endswith(f"#### {truth}")
    # The recipe's reward scores a right "#### n" answer 1 and a wrong one 0.
    score = SCORING_FUNCTIONS[DATA_SOURCE]
    assert score(f"so #### {truth}", truth, None) == 1.0
    assert score(f"#### {int(truth) + 1}", truth, None) == 0.0


def test_prepare_data_from_original_jsonl(tmp_path: Path) -> None:
    examples = [
        {"question": "How much is 1200 + 34?", "answer": "1200 + 34 = 1234\n#### 1,234"},
        {"question": "Half of 9?", "answer": "9 / 2 = 4.5\n#### 4.50"},
    ]
    write_rows(examples, tmp_path / "src" / "train.jsonl")
    write_rows(examples[:1], tmp_path / "src" / "test.jsonl")
    out = prepare_gsm8k(tmp_path / "src", tmp_path / "out", instruction="End with ####.")
    rows = read_rows(out["train"])
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["1234", "4.5"]
    assert rows[1]["prompt"][0]["content"] == "Half of 9? End with ####."
    assert read_rows(out["test"])[0]["extra_info"]["split"] == "test"


def test_prepare_data_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="main/train-"):
        prepare_gsm8k(tmp_path, tmp_path / "out")
    write_rows([{"question": "q", "answer": "no marker"}], tmp_path / "train.jsonl")
    with pytest.raises(ValueError, match="train example 0"):
        prepare_gsm8k(tmp_path, tmp_path / "out")


def test_recipe_names_missing_model_and_data(tmp_path: Path) -> None:
    from recipes.gsm8k_grpo.main import run

    with pytest.raises(ConfigurationError, match=r"recipe\.model_path"):
        run([])
    with pytest.raises(ConfigurationError, match=r"recipes\.gsm8k\.prepare_data"):
        run([f"recipe.model_path={tmp_path}", "data.train_files=[nowhere/train.parquet]"])


# ---------------------------------------------------------------------- CPU runs


def check_run(history: list[dict[str, Any]], out: Path, names: tuple[str, ...]) -> None:
    """Two steps ran, with finite losses and the expected metrics, and the model was saved."""
    assert len(history) == 2
    for step in history:
        missing = [name for name in names if name not in step]
        assert not missing, f"metrics {missing} not logged; got {sorted(step)}"
        for name in names:
            assert math.isfinite(step[name]), f"{name}={step[name]}"
    assert "val/accuracy" in history[-1]
    logged = [json.loads(line) for line in (out / "logs").rglob("*.jsonl").__next__().open()]
    assert len([r for r in logged if "actor/pg_loss" in r]) == 2
    assert (out / "model" / "config.json").is_file()


@pytest.mark.timeout(240)
def test_gsm8k_grpo_runs_two_steps_on_cpu(
    ray_session: Any, tiny_setup: tuple[Path, Path], tmp_path: Path
) -> None:
    from recipes.gsm8k_grpo.main import run

    torch.set_num_threads(1)
    model, data = tiny_setup
    # The shipped config drops prompt groups that all scored alike (DAPO). The tiny random
    # model scores every sample 0, so with filtering every update would be skipped: the
    # smoke test trains without it, and the skip is checked on one more step.
    history = run([*cpu_overrides(model, data, tmp_path), "algorithm.filter_groups.enable=false"])
    names = ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean")
    check_run(history, tmp_path, names)
    filtered = run(
        [
            *cpu_overrides(model, data, tmp_path / "filtered"),
            "algorithm.filter_groups.max_num_gen_batches=2",
            "trainer.total_training_steps=1",
        ]
    )
    assert filtered[0]["filter_groups/gen_batches"] == 2
    assert filtered[0]["filter_groups/skipped_update"] == 1


@pytest.mark.timeout(240)
def test_gsm8k_ppo_runs_two_steps_on_cpu(
    ray_session: Any, tiny_setup: tuple[Path, Path], tmp_path: Path
) -> None:
    from recipes.gsm8k_ppo.main import run

    torch.set_num_threads(1)
    model, data = tiny_setup
    history = run([*cpu_overrides(model, data, tmp_path), *PPO_CPU_OVERRIDES])
    names = ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm", "critic/score/mean")
    check_run(history, tmp_path, names)
