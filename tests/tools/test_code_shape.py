"""The library's shape limits: functions under 80 lines, public API documented.

These are the limits docs/contributing.md sets; a function that outgrows them is a sign to
split it. Files have no length cap: a file holds one concept, whatever its length. Only
library code (``packages/*/src``) is checked: tests, recipes and tools may be longer.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(ROOT.glob("packages/*/src/**/*.py"))
MAX_FUNCTION_LINES = 80

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def _public_definitions(tree: ast.Module) -> Iterator[ast.ClassDef | FunctionNode]:
    """Module-level classes and functions and the methods of public classes, not ``_private``."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name.startswith("_"):
                continue
            yield node
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, FunctionNode) and not item.name.startswith("_"):
                        yield item


def _overload(node: ast.ClassDef | FunctionNode) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "overload")
        or (isinstance(d, ast.Attribute) and d.attr in {"overload", "setter"})
        for d in node.decorator_list
    )


def test_sources_are_found() -> None:
    assert len(SOURCES) > 50, f"expected the packages' sources under {ROOT}/packages"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_function_sizes(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    long = [
        f"{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, FunctionNode)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path}: functions over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_public_definitions_have_docstrings(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    missing = [
        f"{node.name} (line {node.lineno})"
        for node in _public_definitions(tree)
        if ast.get_docstring(node) is None and not _overload(node)
    ]
    assert not missing, f"{path}: public definitions without a docstring: {missing}"
