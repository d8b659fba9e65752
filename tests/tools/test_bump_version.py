"""Tests for tools/bump_version.py on a fake two-package workspace."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import bump_version
import check_versions
import pytest
from packaging.version import Version


def test_minor_bump_rewrites_version_and_changelog_and_flags_dependent(
    workspace_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alpha = workspace_root / "packages" / "hf-alpha"
    pyproject_before = (alpha / "pyproject.toml").read_text()

    code = bump_version.main(
        [
            "hf-alpha",
            "minor",
            "-m",
            "Uneven splits.",
            "-m",
            "Faster concat.",
            "--root",
            str(workspace_root),
        ]
    )

    out = capsys.readouterr().out
    assert code == 0
    assert "hf-alpha: 0.1.0 -> 0.2.0" in out
    # Only the version line changed; every other byte of the file is as it was.
    expected = pyproject_before.replace('version = "0.1.0"', 'version = "0.2.0"')
    assert (alpha / "pyproject.toml").read_text() == expected
    assert (alpha / "CHANGELOG.md").read_text() == (
        "# Changelog — hf-alpha\n\n"
        f"## 0.2.0 — {date.today().isoformat()}\n\n"
        "- Uneven splits.\n"
        "- Faster concat.\n\n"
        "## 0.1.0 — 2024-01-01\n\n- First release.\n"
    )
    # hf-beta declares hf-alpha>=0.1,<0.2, which 0.2.0 is outside of.
    assert 'ACTION NEEDED: hf-beta requires "hf-alpha>=0.1,<0.2"' in out
    assert "does not admit hf-alpha 0.2.0" in out
    assert 'Widen it, e.g. to "hf-alpha>=0.1,<0.3"' in out
    assert check_versions.main(["--root", str(workspace_root)]) == 1


def test_patch_bump_keeps_dependents_happy(
    workspace_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = bump_version.main(["hf-alpha", "patch", "-m", "Fix.", "--root", str(workspace_root)])

    out = capsys.readouterr().out
    assert code == 0
    assert "0.1.0 -> 0.1.1" in out
    assert "ACTION NEEDED" not in out
    assert check_versions.main(["--root", str(workspace_root)]) == 0


def test_unknown_package_lists_the_known_ones(
    workspace_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = bump_version.main(["hf-nope", "patch", "-m", "x", "--root", str(workspace_root)])

    assert code == 1
    assert "unknown package 'hf-nope'; known packages: hf-alpha, hf-beta" in capsys.readouterr().err


def test_bad_part_and_empty_message_are_usage_errors(workspace_root: Path) -> None:
    with pytest.raises(SystemExit) as bad_part:
        bump_version.main(["hf-alpha", "micro", "-m", "x", "--root", str(workspace_root)])
    with pytest.raises(SystemExit) as empty_message:
        bump_version.main(["hf-alpha", "patch", "-m", "  ", "--root", str(workspace_root)])

    assert bad_part.value.code == 2
    assert empty_message.value.code == 2


@pytest.mark.parametrize(
    ("version", "part", "expected"),
    [
        ("0.1.0", "patch", "0.1.1"),
        ("0.1.7", "minor", "0.2.0"),
        ("0.9.3", "major", "1.0.0"),
        ("1.2", "patch", "1.2.1"),
        ("2.0.0rc1", "patch", "2.0.1"),
    ],
)
def test_bumped(version: str, part: str, expected: str) -> None:
    assert bump_version.bumped(Version(version), part) == Version(expected)


def test_set_project_version_touches_only_the_project_table() -> None:
    text = (
        '[project]\r\nname = "x"\r\nversion = "0.1.0"  # keep me\r\n\r\n'
        '[tool.other]\r\nversion = "9.9.9"\r\n'
    )

    new = bump_version.set_project_version(text, Version("0.2.0"))

    assert new == text.replace('"0.1.0"', '"0.2.0"')


def test_changelog_gets_a_title_when_empty() -> None:
    text = bump_version.add_changelog_section(
        "", "Changelog", Version("0.1.1"), date(2025, 1, 2), ["A"]
    )

    assert text == "# Changelog\n\n## 0.1.1 — 2025-01-02\n\n- A\n"
