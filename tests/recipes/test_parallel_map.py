"""recipes/parallel_map end to end: counts on real Ray and on the local backend equal a
single-process reference count, and the recipe never imports torch."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from recipes.parallel_map.config import ParallelMapConfig, field_docs
from recipes.parallel_map.corpus import generate_corpus
from recipes.parallel_map.counts import WordCounts, count_files
from recipes.parallel_map.files import FileList, find_text_files
from recipes.parallel_map.main import parse_args, run_recipe

REPO_ROOT = Path(__file__).resolve().parents[2]


def reference_counts(directory: Path) -> WordCounts:
    """Count the synthetic corpus another way: strip its only punctuation, split on spaces."""
    words: Counter[str] = Counter()
    lines = size = files = 0
    for path in sorted(directory.glob("*.txt")):
        text = path.read_text(encoding="ascii")
        words.update(text.lower().replace(",", " ").replace(".", " ").split())
        lines += text.count("\n")
        size += len(text)
        files += 1
    return WordCounts(words, files, lines, size)


# ---------------------------------------------------------------------- pieces


def test_file_list_chunks_are_balanced_and_concat_restores_them() -> None:
    files = FileList(tuple(f"f{i}" for i in range(10)))
    parts = files.chunk(4)
    assert [len(p) for p in parts] == [3, 3, 2, 2]
    assert FileList.concat(parts) == files
    assert [len(p) for p in FileList(("a",)).chunk(3)] == [1, 0, 0]


def test_corpus_is_deterministic_and_reused(tmp_path: Path) -> None:
    first = generate_corpus(tmp_path / "a", num_files=3, megabytes=0.05, seed=7)
    second = generate_corpus(tmp_path / "b", num_files=3, megabytes=0.05, seed=7)
    for path_a, path_b in zip(first, second, strict=True):
        assert Path(path_a).read_bytes() == Path(path_b).read_bytes()
    before = Path(first.paths[0]).stat().st_mtime_ns
    assert generate_corpus(tmp_path / "a", num_files=3, megabytes=0.05, seed=7) == first
    assert Path(first.paths[0]).stat().st_mtime_ns == before  # reused, not rewritten
    other = generate_corpus(tmp_path / "a", num_files=3, megabytes=0.05, seed=8)
    assert Path(other.paths[0]).read_bytes() != Path(second.paths[0]).read_bytes()


def test_count_files_matches_reference(tmp_path: Path) -> None:
    generate_corpus(tmp_path, num_files=4, megabytes=0.2, seed=1)
    counts = count_files(find_text_files(tmp_path))
    assert counts == reference_counts(tmp_path)
    assert counts.words["it's"] > 0  # the apostrophe rule is exercised


def test_word_counts_concat_sums_everything() -> None:
    a = WordCounts(Counter({"x": 2, "y": 1}), files=1, lines=3, bytes=10)
    b = WordCounts(Counter({"y": 4}), files=2, lines=1, bytes=5)
    assert WordCounts.concat([a, b]) == WordCounts(Counter({"x": 2, "y": 5}), 3, 4, 15)
    assert WordCounts.concat([a, b]).top(1) == [("y", 5)]


# ---------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"worker": 2}, "unknown config key 'worker'; did you mean 'workers'"),
        ({"workers": 0}, "workers=0 must be positive"),
        ({"workers": "2"}, "workers='2' is a str; it must be a int"),
        ({"top_k": True}, "top_k=True is a bool"),
        ({"backend": "dask"}, "backend='dask' is not known; use one of ray, local"),
        ({"input_dir": "/no/such/dir"}, "input_dir='/no/such/dir' is not a directory"),
    ],
)
def test_config_errors_name_the_value_and_the_fix(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ParallelMapConfig.from_dict(values)


def test_every_config_field_is_documented_and_has_a_flag() -> None:
    docs = field_docs(ParallelMapConfig)
    names = [f.name for f in dataclasses.fields(ParallelMapConfig)]
    assert sorted(docs) == sorted(names)
    assert all(len(doc) > 10 for doc in docs.values())
    assert parse_args(["--pattern", "*.md"]).pattern == "*.md"


def test_command_line_flags_build_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    config = parse_args(["--small", "--workers", "3", "--no-compare-single", "--top-k", "5"])
    assert (config.workers, config.compare_single, config.top_k) == (3, False, 5)
    assert config.corpus_mb == ParallelMapConfig.small().corpus_mb
    with pytest.raises(SystemExit):
        parse_args(["--workers", "-1"])
    assert "workers=-1 must be positive" in capsys.readouterr().err


# ---------------------------------------------------------------------- end to end


def check_outputs(output_dir: Path, runs: list[Any], expected: WordCounts) -> None:
    """Every run counted exactly the reference; result.json and trace.json were written."""
    for run in runs:
        assert run.counts == expected, f"{run.label} ({run.backend}) miscounted"
        assert run.phases["execute"] > 0
    result = json.loads((output_dir / "result.json").read_text())
    assert result["words"] == expected.total_words
    assert [r["workers"] for r in result["runs"]] == [run.workers for run in runs]
    trace = json.loads((output_dir / "trace.json").read_text())
    calls = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "count_words"]
    assert len(calls) == 3 * len(runs) * 2  # 3 phases x runs x 2 rounds


@pytest.mark.timeout(120)
def test_recipe_on_ray_with_two_workers(ray_session: Any, tmp_path: Path) -> None:
    config = ParallelMapConfig.small(output_dir=str(tmp_path), workers=2)
    runs = run_recipe(config)
    assert [run.workers for run in runs] == [1, 2]
    check_outputs(tmp_path, runs, reference_counts(tmp_path / "corpus"))


@pytest.mark.timeout(60)
def test_recipe_on_local_backend_with_uneven_shards(tmp_path: Path) -> None:
    # 5 files in 2 rounds of 3 and 2 files over 4 workers: some workers get no file.
    config = ParallelMapConfig.small(
        output_dir=str(tmp_path), workers=4, backend="local", corpus_files=5, corpus_mb=0.5
    )
    runs = run_recipe(config)
    assert [(run.workers, run.backend) for run in runs] == [(1, "local"), (4, "local")]
    check_outputs(tmp_path, runs, reference_counts(tmp_path / "corpus"))


@pytest.mark.timeout(180)
def test_recipe_runs_without_importing_torch(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from recipes.parallel_map.main import main
        for backend in ("local", "ray"):
            main(["--small", "--backend", backend, "--output-dir", {str(tmp_path)!r}])
        loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        assert not loaded, f"the recipe imported {{loaded}}"
        print("TORCH-FREE")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "TORCH-FREE" in done.stdout
