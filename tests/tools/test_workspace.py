"""Tests for tools/workspace.py: discovery, sibling requirements, closure, order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import workspace
from packaging.version import Version


def test_discover_reads_names_versions_paths_and_requirements(workspace_root: Path) -> None:
    ws = workspace.discover(workspace_root)

    assert sorted(ws.packages) == ["hf-alpha", "hf-beta"]
    beta = ws.get("hf-beta")
    assert beta.name == "hf-beta"
    assert beta.version == Version("0.3.0")
    assert beta.path == workspace_root / "packages" / "hf-beta"
    assert beta.import_name == "hf_beta"
    assert beta.extras == {"test"}
    declared = [(str(d.requirement), d.extra) for d in beta.requirements]
    assert declared == [("hf-alpha<0.2,>=0.1", None), ("pytest>=8", "test")]


def test_get_accepts_any_spelling_and_lists_known_names(workspace_root: Path) -> None:
    ws = workspace.discover(workspace_root)

    assert ws.get("HF_Alpha").name == "hf-alpha"
    with pytest.raises(workspace.WorkspaceError, match="known packages: hf-alpha, hf-beta"):
        ws.get("hf-gamma")


def test_topological_order_puts_dependencies_first(
    workspace_root: Path, make_package: Callable[..., Path]
) -> None:
    # "aa-" sorts first by name, but it needs hf-beta, so it must come last.
    make_package("aa-first-by-name", "1.0.0", extras={"extra": ["hf-beta>=0.3"]})
    ws = workspace.discover(workspace_root)

    order = [p.name for p in ws.topological_order()]

    assert order == ["hf-alpha", "hf-beta", "aa-first-by-name"]


def test_sibling_requirements_include_extras_and_skip_self_and_third_party(
    workspace_root: Path, make_package: Callable[..., Path]
) -> None:
    make_package(
        "hf-gamma",
        "0.1.0",
        dependencies=["numpy>=1.26"],
        extras={"beta": ["hf-beta>=0.3,<0.4"], "all": ["hf-gamma[beta]"]},
    )
    ws = workspace.discover(workspace_root)

    siblings = ws.sibling_requirements(ws.get("hf-gamma"))

    assert [(d.requirement.name, d.extra) for d in siblings] == [("hf-beta", "beta")]


def test_sibling_closure_follows_extras_transitively(
    workspace_root: Path, make_package: Callable[..., Path]
) -> None:
    # hf-gamma needs hf-beta only for its tests; hf-beta brings hf-alpha along.
    make_package("hf-gamma", "0.1.0", extras={"test": ["pytest>=8", "hf-beta>=0.3"]})
    make_package("hf-delta", "0.1.0", extras={"ray": ["hf-gamma[test]"]})
    ws = workspace.discover(workspace_root)

    assert ws.sibling_closure("hf-gamma") == []
    assert [p.name for p in ws.sibling_closure("hf-gamma", ["test"])] == ["hf-alpha", "hf-beta"]
    closure = ws.sibling_closure("hf-delta", ["ray"])
    assert [p.name for p in closure] == ["hf-alpha", "hf-beta", "hf-gamma"]


def test_cycle_is_reported(workspace_root: Path, edit: Callable[[Path, str, str], None]) -> None:
    alpha = workspace_root / "packages" / "hf-alpha" / "pyproject.toml"
    edit(alpha, "dependencies = []", 'dependencies = ["hf-beta>=0.3"]')
    ws = workspace.discover(workspace_root)

    with pytest.raises(workspace.WorkspaceError, match="cycle"):
        ws.topological_order()


def test_dynamic_version_is_rejected_with_the_reason(
    workspace_root: Path, edit: Callable[[Path, str, str], None]
) -> None:
    alpha = workspace_root / "packages" / "hf-alpha" / "pyproject.toml"
    edit(alpha, 'version = "0.1.0"', 'dynamic = ["version"]')

    with pytest.raises(workspace.WorkspaceError, match=r"no static \[project\] version"):
        workspace.discover(workspace_root)


def test_unparsable_requirement_names_the_file(
    workspace_root: Path, edit: Callable[[Path, str, str], None]
) -> None:
    beta = workspace_root / "packages" / "hf-beta" / "pyproject.toml"
    edit(beta, '"hf-alpha>=0.1,<0.2"', '"../hf-alpha"')

    with pytest.raises(workspace.WorkspaceError, match=r"hf-beta.*invalid requirement"):
        workspace.discover(workspace_root)
