"""recipes/online_dpo and recipes/dpo: a few DPO steps on CPU with a tiny model, real Ray
workers, finite losses and the implicit-reward metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch


def read_jsonl_metrics(log_dir: Path) -> list[dict[str, Any]]:
    """The records of the one jsonl metrics file under ``log_dir``."""
    files = sorted(log_dir.rglob("*.jsonl"))
    assert len(files) == 1, files
    return [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]


@pytest.mark.timeout(240)
def test_online_dpo_trains_on_sampled_pairs(ray_session: Any, tmp_path: Path) -> None:
    from recipes.online_dpo.main import run

    torch.set_num_threads(1)
    history = run([f"workdir={tmp_path}", "steps=3", "prompts_per_step=8", "loggers=[jsonl]"])
    assert len(history) == 3
    trained = [step for step in history if step["pairs"] > 0]
    assert trained, "no step found a pair: every prompt's samples scored the same"
    for step in trained:
        for name in ("actor/dpo_loss", "actor/reward_margin", "actor/reward_accuracy"):
            assert math.isfinite(step[name]), (name, step)
        assert 0 < step["pairs"] <= 8
    # The first update starts at the reference: loss log(2), zero margin.
    first = trained[0]
    assert first["actor/dpo_loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert abs(first["actor/reward_margin"]) < 1e-5
    logged = read_jsonl_metrics(tmp_path / "logs")
    assert [record["score/mean"] for record in logged] == [s["score/mean"] for s in history]
    assert (tmp_path / "model" / "config.json").is_file()
    assert (tmp_path / "model" / "tokenizer.json").is_file()


def test_synthetic_preferences_prefer_the_reversal() -> None:
    from recipes.dpo.synthetic import make_preference_rows

    rows = make_preference_rows(200, length=4, seed=3)
    assert rows == make_preference_rows(200, length=4, seed=3)
    for row in rows:
        letters = row["prompt"].removesuffix("=")
        assert row["chosen"] == letters[::-1]
        assert row["rejected"] != row["chosen"] and len(row["rejected"]) == 4
    assert any(row["rejected"] == row["prompt"][:-1] for row in rows)  # copies and near misses


@pytest.mark.timeout(240)
def test_offline_dpo_recipe_trains_and_validates(ray_session: Any, tmp_path: Path) -> None:
    from recipes.dpo.main import run

    torch.set_num_threads(1)
    overrides = [
        f"recipe.workdir={tmp_path}",
        "recipe.synthetic_pairs=256",
        "trainer.total_training_steps=6",
        "trainer.test_freq=3",
        "trainer.loggers=[jsonl]",
        "trainer.progress_bar=false",
    ]
    history = run(overrides)
    assert len(history) == 6
    for step in history:
        for name in ("actor/dpo_loss", "actor/reward_margin", "actor/reward_accuracy"):
            assert math.isfinite(step[name]), (name, step)
    assert history[0]["actor/dpo_loss"] == pytest.approx(math.log(2), abs=1e-4)
    # After the updates the policy has moved off the reference on held-out pairs.
    assert history[-1]["val/dpo/reward_margin"] != 0.0
    logged = read_jsonl_metrics(tmp_path / "logs")
    assert logged[0]["val/dpo/reward_accuracy"] == pytest.approx(0.0)  # before training
    assert (tmp_path / "model" / "config.json").is_file()
