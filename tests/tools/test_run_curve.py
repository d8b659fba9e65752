"""tools/bench/run_curve.py: a run's validation points against its training seconds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "tools" / "bench"
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from run_curve import DEFAULT_METRICS, curve, main, read_records, table  # noqa: E402


def write_log(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def test_points_carry_the_training_seconds_before_them(tmp_path: Path) -> None:
    log = write_log(
        tmp_path / "metrics.jsonl",
        [
            {"step": 0, "val/accuracy": 0.1, "val/sampled/accuracy": 0.05},
            {"step": 1, "timing_s/step": 30.0},
            {"step": 2, "timing_s/step": 40.0, "val/accuracy": 0.5},
            {"step": 2, "val/sampled/accuracy": 0.4},  # a second line of the same step
            {"step": 3, "timing_s/step": 50.0, "val/accuracy": None},
        ],
    )
    points = curve(read_records(log), DEFAULT_METRICS)
    assert [(p.step, p.seconds) for p in points] == [(0, 0.0), (2, 70.0)]
    assert points[1].values == {"val/accuracy": 0.5, "val/sampled/accuracy": 0.4}
    rendered = table(points, DEFAULT_METRICS)
    assert "| 2 | 1.2 | 0.500 | 0.400 |" in rendered


def test_bad_lines_and_missing_metrics_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\nnot json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2 is not a JSON line"):
        read_records(bad)
    empty = write_log(tmp_path / "none.jsonl", [{"step": 1, "timing_s/step": 3.0}])
    with pytest.raises(ValueError, match="is validation on"):
        curve(read_records(empty), DEFAULT_METRICS)


def test_main_writes_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path / "m.jsonl", [{"step": 0, "val/accuracy": 0.2}])
    png = tmp_path / "curve.png"
    assert main([str(log), "--plot", str(png), "--metric", "val/accuracy"]) == 0
    assert png.stat().st_size > 0
    assert "| 0 | 0.0 | 0.200 |" in capsys.readouterr().out
