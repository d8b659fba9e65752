"""Metrics with verl's names from a real batch, and every logger writing real files."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch

from hf_algos.tracking import (
    LOGGERS,
    ConsoleLogger,
    RunInfo,
    Tracking,
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    merge_worker_metrics,
    register_logger,
    timed,
)
from hf_protocol import DataProto


def rollout_batch() -> DataProto:
    """Two prompts of width 3 (one left-padded) and responses of width 4."""
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    response_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    scores = torch.zeros(2, 4)
    scores[0, 1], scores[1, 3] = 1.0, 0.5
    return DataProto.from_dict(
        tensors={
            "prompts": torch.ones(2, 3, dtype=torch.long),
            "responses": torch.ones(2, 4, dtype=torch.long),
            "response_mask": response_mask,
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "token_level_scores": scores,
            "token_level_rewards": scores - 0.1 * response_mask,
            "advantages": torch.arange(8.0).reshape(2, 4),
            "returns": torch.ones(2, 4),
            "values": torch.full((2, 4), 0.5),
        }
    )


def test_data_metrics_values() -> None:
    metrics = compute_data_metrics(rollout_batch(), max_response_length=4, max_prompt_length=3)
    assert metrics["critic/score/mean"] == pytest.approx(0.75)
    assert metrics["critic/score/max"] == pytest.approx(1.0)
    assert metrics["critic/rewards/mean"] == pytest.approx((0.8 + 0.1) / 2)
    # advantages over the 6 valid tokens: 0, 1, 4, 5, 6, 7
    assert metrics["critic/advantages/mean"] == pytest.approx(23 / 6)
    assert metrics["critic/advantages/min"] == 0.0
    assert metrics["response_length/mean"] == pytest.approx(3.0)
    assert metrics["response_length/clip_ratio"] == pytest.approx(0.5)
    assert metrics["prompt_length/mean"] == pytest.approx(2.5)
    assert metrics["prompt_length/clip_ratio"] == pytest.approx(0.5)
    assert metrics["critic/values/mean"] == pytest.approx(0.5)
    assert "critic/vf_explained_var" in metrics


def test_timing_throughput_and_worker_metrics() -> None:
    batch = rollout_batch()
    timing: dict[str, float] = {}
    with timed("gen", timing):
        pass
    timing["update_actor"] = 0.5
    metrics = compute_timing_metrics(batch, timing)
    assert metrics["timing_s/update_actor"] == 0.5
    assert metrics["timing_per_token_ms/update_actor"] == pytest.approx(1000 * 0.5 / 11)
    assert "timing_s/gen" in metrics and "timing_per_token_ms/gen" in metrics
    perf = compute_throughput_metrics(batch, step_seconds=2.0, n_workers=2)
    assert perf["perf/total_num_tokens"] == 11
    assert perf["perf/throughput"] == pytest.approx(11 / 2 / 2)
    out = DataProto(meta_info={"metrics": {"actor/pg_loss": [1.0, 3.0], "actor/lr": 0.1}})
    merged = merge_worker_metrics([out, {"actor/pg_loss": [2.0]}])
    assert merged == {"actor/pg_loss": pytest.approx(2.0), "actor/lr": pytest.approx(0.1)}


def test_console_jsonl_tensorboard(tmp_path: Path) -> None:
    tracking = Tracking("proj", "exp", ["console", "jsonl", "tensorboard"], tmp_path)
    stream = io.StringIO()
    tracking.loggers["console"] = ConsoleLogger(RunInfo("p", "e", tmp_path), stream=stream)
    tracking.log({"critic/score/mean": 0.25, "perf/throughput": 10}, step=1)
    tracking.log({"critic/score/mean": 0.5}, step=2)
    tracking.finish()
    assert "step 2 | critic/score/mean 0.5" in stream.getvalue()
    lines = [json.loads(x) for x in (tmp_path / "exp.jsonl").read_text().splitlines()]
    assert lines == [
        {"step": 1, "critic/score/mean": 0.25, "perf/throughput": 10.0},
        {"step": 2, "critic/score/mean": 0.5},
    ]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard" / "exp"))
    events.Reload()
    scalars = events.Scalars("critic/score/mean")
    assert [(s.step, s.value) for s in scalars] == [(1, 0.25), (2, 0.5)]


def test_registry_and_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_logger("console", ConsoleLogger)
    with pytest.raises(ValueError, match="choose from"):
        Tracking("p", "e", ["nosuch"], tmp_path)
    assert {"console", "jsonl", "tensorboard", "wandb", "mlflow"} <= set(LOGGERS)


def _optional(module: str) -> None:
    """Import ``module`` (installed by the ``test`` extra through ``hf-algos[loggers]``)."""
    pytest.importorskip(module)


def test_missing_optional_logger_is_skipped_with_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail as if absent
    with pytest.warns(UserWarning, match="pip install 'hf-algos\\[loggers\\]'"):
        tracking = Tracking("p", "e", ["console", "wandb"], tmp_path)
    assert list(tracking.loggers) == ["console"]
    with pytest.raises(ImportError, match="not installed"):
        Tracking("p", "e", ["wandb"], tmp_path, strict=True)


def test_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _optional("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with Tracking("proj", "exp", ["wandb"], tmp_path, config={"a": 1}, strict=True) as tracking:
        tracking.log({"critic/score/mean": 0.5}, step=1)
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_mlflow_file_store(tmp_path: Path) -> None:
    _optional("mlflow")
    with Tracking("proj", "exp", ["mlflow"], tmp_path, config={"a": {"b": 2}}, strict=True) as t:
        t.log({"critic/score/mean": 0.5}, step=1)
        t.log({"critic/score/mean": 0.75}, step=2)
        logger = t.loggers["mlflow"]
        history = logger.client.get_metric_history(logger.run_id, "critic/score/mean")  # type: ignore[attr-defined]
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75)]
