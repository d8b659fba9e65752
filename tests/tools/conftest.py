"""Fixtures for the workspace tools' tests: a tiny fake workspace built in tmp_path.

The tools are scripts in ``tools/`` (not an installed package); their directory is
put on sys.path here so the tests import them as the scripts import each other.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

TOOLS_DIR = Path(__file__).resolve().parents[2] / "tools"
if str(TOOLS_DIR) not in sys.path:
    sys.path.insert(0, str(TOOLS_DIR))

MakePackage = Callable[..., Path]


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


@pytest.fixture
def make_package(tmp_path: Path) -> MakePackage:
    """Return ``make(name, version, dependencies=(), extras=None)`` writing a package.

    The package gets a hatchling pyproject, ``src/<import_name>/__init__.py``, a
    CHANGELOG.md and a test that checks it was imported from an installed wheel.
    """

    def make(
        name: str,
        version: str,
        dependencies: list[str] | None = None,
        extras: dict[str, list[str]] | None = None,
    ) -> Path:
        import_name = name.replace("-", "_")
        path = tmp_path / "packages" / name
        (path / "src" / import_name).mkdir(parents=True)
        (path / "tests").mkdir()
        all_extras = {"test": ["pytest>=8"], **(extras or {})}
        extra_lines = "".join(f"{key} = {_toml_list(v)}\n" for key, v in all_extras.items())
        (path / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["hatchling>=1.25"]\nbuild-backend = "hatchling.build"\n\n'
            f'[project]\nname = "{name}"\nversion = "{version}"\nrequires-python = ">=3.11"\n'
            f"dependencies = {_toml_list(dependencies or [])}\n\n"
            f"[project.optional-dependencies]\n{extra_lines}\n"
            f'[tool.hatch.build.targets.wheel]\npackages = ["src/{import_name}"]\n\n'
            '[tool.pytest.ini_options]\naddopts = "--import-mode=importlib"\n',
            encoding="utf-8",
        )
        (path / "CHANGELOG.md").write_text(
            f"# Changelog — {name}\n\n## {version} — 2024-01-01\n\n- First release.\n",
            encoding="utf-8",
        )
        (path / "src" / import_name / "__init__.py").write_text(f"NAME = {name!r}\n")
        (path / "tests" / f"test_{import_name}.py").write_text(
            f"import {import_name}\n\n\n"
            "def test_imported_from_installed_wheel() -> None:\n"
            f"    assert {import_name}.NAME == {name!r}\n"
            f'    assert "site-packages" in {import_name}.__file__\n'
        )
        return path

    return make


@pytest.fixture
def workspace_root(tmp_path: Path, make_package: MakePackage) -> Path:
    """Two packages: hf-beta 0.3.0 requires hf-alpha (0.1.0) by range ``>=0.1,<0.2``.

    The workspace also gets a copy of the real tools/constraints.txt.
    """
    make_package("hf-alpha", "0.1.0")
    make_package("hf-beta", "0.3.0", dependencies=["hf-alpha>=0.1,<0.2"])
    (tmp_path / "tools").mkdir()
    shutil.copy(TOOLS_DIR / "constraints.txt", tmp_path / "tools" / "constraints.txt")
    return tmp_path


def replace_in_file(path: Path, old: str, new: str) -> None:
    """Replace ``old`` (which must occur) by ``new`` in the file at ``path``."""
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new), encoding="utf-8")


@pytest.fixture
def edit() -> Callable[[Path, str, str], None]:
    """The :func:`replace_in_file` helper, as a fixture (test modules can't import conftest)."""
    return replace_in_file
