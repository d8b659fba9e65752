"""Tests for tools/gen_verl_keys.py: the verl key map in docs/from-verl.md is the loader's."""

from __future__ import annotations

from pathlib import Path

import gen_verl_keys as gen
import pytest

from hf_algos.config import VERL_ALIASES


def test_committed_key_map_is_up_to_date() -> None:
    committed = gen.OUTPUT.read_text(encoding="utf-8")

    assert committed == gen.updated(committed), (
        "docs/from-verl.md's key map is stale; run `python tools/gen_verl_keys.py` and commit it"
    )


def test_every_alias_is_a_row_and_the_refused_key_says_why() -> None:
    table = gen.render_table()

    assert all(f"| `{alias.verl}` |" in table for alias in VERL_ALIASES)
    row = next(line for line in table.splitlines() if "staleness_threshold` |" in line)
    assert "**refused**" in row and "set trainer.max_staleness" in row
    computed = next(line for line in table.splitlines() if "actor.ppo_mini_batch_size` |" in line)
    assert "computed" in computed and "verl's value x rollout.n" in computed


def test_check_mode_fails_on_a_stale_table_and_passes_after_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "from-verl.md"
    page.write_text(f"# intro\n\n{gen.START}\n| old |\n{gen.END}\n\nafter\n", encoding="utf-8")

    stale = gen.main(["--check", "--output", str(page)])
    assert "stale" in capsys.readouterr().err
    written = gen.main(["--output", str(page)])
    fresh = gen.main(["--check", "--output", str(page)])

    assert (stale, written, fresh) == (1, 0, 0)
    assert page.read_text(encoding="utf-8").endswith("\n\nafter\n")
