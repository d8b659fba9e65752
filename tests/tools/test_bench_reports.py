"""The start-up phase arithmetic of bench_startup.py, the over-seeds table of bench_grpo.py,
the per-run load record of bench_real_grpo.py and a tiny run of bench_multiturn.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "tools" / "bench"
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import bench_multiturn  # noqa: E402
import grpo_task  # noqa: E402
from bench_startup import phase_seconds  # noqa: E402
from grpo_report import ColumnResult, summary_table  # noqa: E402


def test_phases_add_up_and_unmarked_time_goes_to_the_next_phase() -> None:
    marks = [
        ("interpreter", 100.5, 100.5),
        ("imports", 100.5, 104.0),
        ("ray start", 105.0, 109.0),  # 1 s before it that no phase marked
        ("init_model", 109.0, 109.5),
        ("validation", 109.5, 110.0),
        ("validation", 120.0, 121.0),  # a later validation: after the first step
        ("first step", 110.0, 111.0),
    ]
    seconds = phase_seconds(100.0, marks)
    assert seconds["interpreter"] == 0.5
    assert seconds["imports"] == 3.5
    assert seconds["ray start"] == 5.0  # 4 s marked + 1 s unclaimed before it
    assert seconds["other"] == 1.0
    assert seconds["first step"] == 1.0
    assert seconds["total to first step"] == 11.0
    assert seconds["to first step w/o validation"] == 10.5


def _record(steps: list[float], evals: list[tuple[int, float, float]]) -> grpo_task.RunRecord:
    return grpo_task.RunRecord(
        name="x",
        warmup_accuracy=evals[0][2],
        step_seconds=steps,
        evals=[{"step": s, "train_seconds": t, "accuracy": a} for s, t, a in evals],
    )


def test_the_table_takes_medians_over_seeds_and_counts_the_runs_that_reached_the_target() -> None:
    plain = _record([0.2, 0.2, 0.2], [(0, 0, 0.2), (25, 5.0, 0.95)])
    hybrid = [
        ColumnResult("HybridFlow", _record([0.3], [(0, 0, 0.2), (25, 7.0, 0.91)]), "ok", 30, 8.0),
        ColumnResult("HybridFlow", _record([0.2], [(0, 0, 0.2), (25, 5.0, 0.5)]), "ok", 20, 6.0),
        ColumnResult("HybridFlow", _record([0.25], [(0, 0, 0.2), (50, 9.0, 0.93)]), "ok", 25, 7.0),
    ]
    missing = ColumnResult("HybridFlow fully_async", None, "failed (exit 1); log x")
    table = summary_table(
        [ColumnResult("plain torch loop", plain, "ok", 10), *hybrid, missing], 0.9
    )
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines()}
    hybrid_row = rows["HybridFlow"]
    assert hybrid_row[1:5] == ["3", "0.250", "1.25x", "-"]  # runs, s/step, ratio, CPU s/step
    assert hybrid_row[5] == "7.0"  # start-up: median of 8, 6, 7
    assert hybrid_row[7:10] == ["2/3", "38", "8.0"]  # reached; median steps, train s of those
    assert rows["HybridFlow fully_async"][1:3] == ["0", "failed (exit 1); log x"]


def test_the_multiturn_bench_reports_reuse_with_the_same_samples(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tiny = "--episodes 2 --turns 3 --new-tokens 4 --reply-tokens 3 --prompt-tokens 6 --hidden 64"
    assert bench_multiturn.main([*tiny.split(), "--layers", "1", "--repeats", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| 6 "))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    # Re-prefill feeds the conversation each turn (6 + 13 + 20 per episode); reuse feeds
    # the prompt once, then the last sampled token and the reply (1 + 3) per later turn.
    assert cells[4] == f"{2 * (6 + 13 + 20)} / {2 * (6 + 4 + 4)}"
    assert cells[6] == "yes" and float(cells[7]) < 1e-5


def test_the_real_grpo_bench_keeps_each_runs_load_for_a_later_summary(tmp_path: Path) -> None:
    import bench_real_grpo

    bench_real_grpo.record_load(tmp_path, "plain_seed0", 1.0, 1.8)
    bench_real_grpo.record_load(tmp_path, "trl_seed1", 0.4, 2.5)
    bench_real_grpo.record_load(tmp_path, "plain_seed0", 1.1, 1.9)  # a rerun replaces it
    assert bench_real_grpo.read_loads(tmp_path, 9.0) == (0.4, 2.5)
    empty = tmp_path / "none"
    empty.mkdir()
    low, _ = bench_real_grpo.read_loads(empty, 9.0)
    assert low == 9.0


def test_the_real_grpo_bench_runs_every_column_in_the_configs_one_precision() -> None:
    import bench_real_grpo
    import real_grpo_task
    import torch

    from hf_engines.precision import resolve_auto_dtype

    def config(param: str, rollout: str | None, model: str = "float32") -> dict[str, Any]:
        engine = {"fsdp": {"param_dtype": param}, "model": {"dtype": model}}
        return {"actor": {"engine": engine}, "rollout": {"dtype": rollout}}

    assert bench_real_grpo.precision_of(config("float32", None)) == "float32"
    assert bench_real_grpo.precision_of(config("bfloat16", "bfloat16")) == "bfloat16"
    auto = resolve_auto_dtype("cpu", {"dtype": "float32"}).dtype  # this CPU's choice
    assert bench_real_grpo.precision_of(config("auto", None), {"dtype": "float32"}) == auto
    assert bench_real_grpo.precision_of(config(auto, "auto")) == auto
    with pytest.raises(SystemExit, match=r"set rollout\.dtype=float32"):  # fp16: auto is fp32
        bench_real_grpo.precision_of(config("auto", "bfloat16"), {"dtype": "float16"})
    with pytest.raises(SystemExit, match=r"set rollout\.dtype=bfloat16"):
        bench_real_grpo.precision_of(config("bfloat16", None))  # would generate in fp32
    with pytest.raises(SystemExit, match=r"model\.dtype=bfloat16"):
        bench_real_grpo.precision_of(config("bfloat16", "bfloat16", "bfloat16"))
    settings = real_grpo_task.RealSettings(
        8, 8, 32, 1.0, 5e-6, 0.0, (0.9, 0.999), 1e-8, 1.0, 0.2, 0.2, 4, "m", "bfloat16"
    )
    weight = torch.randn(4, 4)  # fp32 weights, bf16 compute, as TRL's bf16=True
    with real_grpo_task.autocast(settings):
        assert (torch.ones(2, 4) @ weight).dtype == torch.bfloat16
    settings.precision = "float32"
    with real_grpo_task.autocast(settings):
        assert (torch.ones(2, 4) @ weight).dtype == torch.float32
    settings.precision = "fp8"
    with pytest.raises(ValueError, match="'fp8'"):
        real_grpo_task.autocast(settings)
