"""Metrics with verl's names from a real batch, and every logger writing real files."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch

from hf_algos.tracking import (
    GENERATION_COLUMNS,
    LOGGERS,
    ConsoleLogger,
    RunInfo,
    Tracking,
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    latest_run_dir,
    merge_worker_metrics,
    metrics_path,
    register_logger,
    resolve_wandb_mode,
    timed,
    timing_metrics,
    write_config,
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


def test_phase_memory_entries_pass_through_the_timing_metrics() -> None:
    """What :func:`timed` records on a CUDA process (here written by hand: no GPU in CI) is
    reported under its own name, with no per-token rate."""
    timing = {"gen": 2.0, "memory_peak_gib/gen": 1.5, "memory_device_gib/gen": 20.0}
    metrics = compute_timing_metrics(rollout_batch(), timing)
    assert metrics["memory_peak_gib/gen"] == 1.5
    assert metrics["memory_device_gib/gen"] == 20.0
    assert metrics["timing_s/gen"] == 2.0
    assert not any("memory" in key for key in metrics if key.startswith("timing"))
    assert timing_metrics({"step": 3.0}) == {"timing_s/step": 3.0}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.gpu
def test_timed_records_the_phase_peak_memory_on_cuda() -> None:
    torch.zeros(1, device="cuda")  # CUDA in use in this process
    timing: dict[str, float] = {}
    with timed("update_actor", timing):
        block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        del block
    assert timing["memory_peak_gib/update_actor"] >= 0.25
    assert timing["memory_device_gib/update_actor"] > 0.0


GENERATIONS = [
    {"data_source": "toy", "prompt": "sort 3 1 2", "response": "1 2 3", "ground_truth": "1 2 3",
     "score": 1.0},
    {"data_source": "toy", "prompt": "sort 9 | 8", "response": "8\n9", "ground_truth": "8 9",
     "score": 0.0},
]  # fmt: skip


def test_console_jsonl_tensorboard(tmp_path: Path) -> None:
    tracking = Tracking("proj", "exp", ["console", "jsonl", "tensorboard"], tmp_path)
    assert tracking.run_dir == tmp_path / "proj" / "exp" / tracking.run_id
    stream = io.StringIO()
    tracking.loggers["console"] = ConsoleLogger(RunInfo("p", "e", tmp_path), stream=stream)
    tracking.log({"critic/score/mean": 0.25, "perf/throughput": 10}, step=1)
    tracking.log({"critic/score/mean": 0.5}, step=2)
    tracking.log_generations(GENERATIONS, step=2)
    tracking.finish()
    assert "step 2 | critic/score/mean 0.5" in stream.getvalue()
    assert "score 1 | prompt 'sort 3 1 2' | response '1 2 3'" in stream.getvalue()
    lines = [json.loads(x) for x in tracking.metrics_path.read_text().splitlines()]
    assert lines == [
        {"step": 1, "critic/score/mean": 0.25, "perf/throughput": 10.0},
        {"step": 2, "critic/score/mean": 0.5},
    ]
    generations = [json.loads(x) for x in (tracking.run_dir / "generations.jsonl").open()]
    assert generations == [{"step": 2, **row} for row in GENERATIONS]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tracking.run_dir))
    events.Reload()
    scalars = events.Scalars("critic/score/mean")
    assert [(s.step, s.value) for s in scalars] == [(1, 0.25), (2, 0.5)]
    (text,) = events.Tensors("val/generations/text_summary")
    table = text.tensor_proto.string_val[0].decode()
    assert text.step == 2 and "sort 9 \\| 8 | 8<br>9 | 8 9 | 0" in table, table


def test_each_run_has_its_own_files_and_a_resumed_run_appends(tmp_path: Path) -> None:
    first = Tracking("proj", "exp", ["jsonl"], tmp_path)
    first.log({"x": 1.0}, step=1)
    first.finish()
    second = Tracking("proj", "exp", ["jsonl"], tmp_path)
    second.log({"x": 2.0}, step=1)
    second.finish()
    assert first.run_dir != second.run_dir  # no silent append to the earlier run's file
    assert [json.loads(x)["x"] for x in first.metrics_path.open()] == [1.0]
    assert latest_run_dir(tmp_path, "proj", "exp") == second.run_dir
    assert metrics_path(tmp_path, "proj", "exp") == second.metrics_path
    assert metrics_path(tmp_path, "proj", "exp", first.run_id) == first.metrics_path
    with Tracking("proj", "exp", ["jsonl"], tmp_path, run_id=first.run_id) as resumed:
        resumed.log({"x": 3.0}, step=2)
    assert [json.loads(x)["x"] for x in first.metrics_path.open()] == [1.0, 3.0]
    with pytest.raises(FileNotFoundError, match=r"trainer\.experiment_name"):
        metrics_path(tmp_path, "proj", "other")


def test_config_yaml_round_trips(tmp_path: Path) -> None:
    import yaml

    config = {"trainer": {"loggers": ("jsonl", "wandb"), "log_dir": tmp_path, "seed": None}}
    path = write_config(tmp_path / "run" / "config.yaml", config)
    assert yaml.safe_load(path.read_text()) == {
        "trainer": {"loggers": ["jsonl", "wandb"], "log_dir": str(tmp_path), "seed": None}
    }


def test_wandb_mode_decision(tmp_path: Path) -> None:
    no_netrc = {"NETRC": str(tmp_path / "absent")}
    assert resolve_wandb_mode("auto", no_netrc)[0] == "offline"
    assert "wandb login" in resolve_wandb_mode("auto", no_netrc)[1]
    assert resolve_wandb_mode("auto", {**no_netrc, "WANDB_API_KEY": "k" * 40})[0] == "online"
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    with_login = {"NETRC": str(netrc)}
    assert resolve_wandb_mode("auto", with_login) == (
        "online",
        f"auto: {netrc} has a key for api.wandb.ai (wandb login)",
    )
    # a self-hosted server: the key must be for its host
    assert resolve_wandb_mode("auto", {**with_login, "WANDB_BASE_URL": "https://wb.corp"})[0] == (
        "offline"
    )
    assert resolve_wandb_mode("auto", {**with_login, "WANDB_MODE": "offline"})[0] == "offline"
    for explicit in ("online", "offline", "disabled"):  # an explicit choice wins
        assert resolve_wandb_mode(explicit, {**no_netrc, "WANDB_MODE": "online"})[0] == explicit
    with pytest.raises(ValueError, match=r"trainer\.wandb_mode='on' is not one of"):
        resolve_wandb_mode("on", no_netrc)


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


def test_wandb_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _optional("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with Tracking("proj", "exp", ["wandb"], tmp_path, config={"a": 1}, strict=True) as tracking:
        tracking.log({"critic/score/mean": 0.5}, step=1)
        tracking.log_generations(GENERATIONS, step=1)
    assert "wandb: mode offline (auto: no API key configured" in capsys.readouterr().out
    (offline,) = (tracking.run_dir / "wandb").glob(f"offline-run-*-{tracking.run_id}")
    (table,) = offline.glob("files/media/table/val/generations_1_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"] == list(GENERATION_COLUMNS)
    assert [row[3] for row in data["data"]] == ["1 2 3", "8\n9"]


def test_mlflow_file_store(tmp_path: Path) -> None:
    _optional("mlflow")
    with Tracking("proj", "exp", ["mlflow"], tmp_path, config={"a": {"b": 2}}, strict=True) as t:
        t.log({"critic/score/mean": 0.5}, step=1)
        t.log_generations(GENERATIONS, step=1)
        logger = t.loggers["mlflow"]
        mlflow_run = logger.run_id  # type: ignore[attr-defined]
    assert (tmp_path / "mlruns").is_dir()  # one store for every run under trainer.log_dir
    with Tracking("proj", "exp", ["mlflow"], tmp_path, run_id=t.run_id, strict=True) as resumed:
        resumed.log({"critic/score/mean": 0.75}, step=2)
        logger = resumed.loggers["mlflow"]
        assert logger.run_id == mlflow_run  # type: ignore[attr-defined]  # the same MLflow run
        client = logger.client  # type: ignore[attr-defined]
        history = client.get_metric_history(mlflow_run, "critic/score/mean")
        table = Path(client.download_artifacts(mlflow_run, "val_generations.json", str(tmp_path)))
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75)]
    content = json.loads(table.read_text())
    assert content["columns"] == list(GENERATION_COLUMNS)
    assert [row[2] for row in content["data"]] == ["sort 3 1 2", "sort 9 | 8"]
