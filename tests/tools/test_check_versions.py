"""Tests for tools/check_versions.py on a fake two-package workspace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import check_versions
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

Edit = Callable[[Path, str, str], None]


def beta_pyproject(root: Path) -> Path:
    """The pyproject.toml of the dependent package in the fake workspace."""
    return root / "packages" / "hf-beta" / "pyproject.toml"


def test_passes_with_a_short_summary(
    workspace_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = check_versions.main(["--root", str(workspace_root)])

    out = capsys.readouterr().out
    assert code == 0
    assert "OK" in out
    assert "hf-alpha 0.1.0, hf-beta 0.3.0" in out
    assert "1 sibling requirement" in out


def test_range_that_excludes_current_version_fails_with_the_fix(
    workspace_root: Path, edit: Edit, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(beta_pyproject(workspace_root), "hf-alpha>=0.1,<0.2", "hf-alpha>=0.2,<0.3")

    code = check_versions.main(["--root", str(workspace_root)])

    err = capsys.readouterr().err
    assert code == 1
    assert 'hf-beta: requirement "hf-alpha>=0.2,<0.3"' in err
    assert "packages/hf-beta/pyproject.toml (dependencies)" in err
    assert "does not admit the current version of hf-alpha, 0.1.0" in err
    assert "widen the range" in err
    assert "bump hf-alpha" in err
    assert "1 problem(s)" in err


def test_range_in_an_extra_is_checked_too(
    workspace_root: Path, edit: Edit, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(beta_pyproject(workspace_root), 'test = ["pytest>=8"]', 'test = ["hf-alpha>=1"]')

    assert check_versions.main(["--root", str(workspace_root)]) == 1
    assert 'extra "test"' in capsys.readouterr().err


def test_path_dependency_fails(
    workspace_root: Path, edit: Edit, capsys: pytest.CaptureFixture[str]
) -> None:
    alpha_dir = workspace_root / "packages" / "hf-alpha"
    edit(beta_pyproject(workspace_root), "hf-alpha>=0.1,<0.2", f"hf-alpha @ file://{alpha_dir}")

    code = check_versions.main(["--root", str(workspace_root)])

    err = capsys.readouterr().err
    assert code == 1
    assert "points at a path or URL" in err
    assert 'replace it with "hf-alpha>=0.1,<0.2"' in err


def test_missing_range_fails(
    workspace_root: Path, edit: Edit, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(beta_pyproject(workspace_root), '"hf-alpha>=0.1,<0.2"', '"hf-alpha"')

    code = check_versions.main(["--root", str(workspace_root)])

    err = capsys.readouterr().err
    assert code == 1
    assert 'hf-beta: requirement "hf-alpha"' in err
    assert "has no version range" in err


@pytest.mark.parametrize(
    ("requirement", "version", "expected"),
    [
        ("hf-a>=0.1,<0.2", "0.2.0", "hf-a>=0.1,<0.3"),
        ("hf-a[ray]>=0.2,<0.3", "0.1.4", "hf-a[ray]>=0.1,<0.2"),
        ("hf-a>=1.0,<2", "2.1.0", "hf-a>=1.0,<3"),
        ("hf-a", "0.4.0", "hf-a>=0.4,<0.5"),
    ],
)
def test_suggest_range(requirement: str, version: str, expected: str) -> None:
    suggested = check_versions.suggest_range(Requirement(requirement), Version(version))

    assert Requirement(suggested) == Requirement(expected)
    assert Requirement(suggested).specifier.contains(version)


def test_each_package_reports_its_pyproject_version() -> None:
    """``hf_x.__version__`` comes from the installed distribution, so it follows bumps."""
    import importlib

    from workspace import discover

    for package in discover().packages.values():
        module = importlib.import_module(package.name.replace("-", "_"))
        assert module.__version__ == str(package.version), package.name
