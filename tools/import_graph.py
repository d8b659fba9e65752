"""Find import cycles between the files of each workspace package.

A cycle (``a`` imports ``b`` imports ``a``) makes import order matter and is
usually papered over with an import inside a function, so here every import
counts wherever it is written (module level or inside a function), except
those under ``if TYPE_CHECKING:``, which never run. Only imports between
modules of the same top-level package are edges:

* ``import hf_x.a.b`` and ``from hf_x.a import b`` (or ``from . import b``) where
  ``b`` is a module: an edge to ``hf_x.a.b``;
* ``from hf_x.a import name`` where ``name`` is not a module: an edge to
  ``hf_x.a`` (its ``__init__`` when ``hf_x.a`` is a package).

The parent packages that Python imports on the way are not edges: every
submodule would otherwise close a cycle with the ``__init__`` that re-exports it.

Usage: ``python tools/import_graph.py [--root DIR]`` prints every cycle and exits 1
when there is one.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: The repository root, when the tool is used from its own checkout.
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Edge:
    """One import of a module by another module of the same package."""

    importer: str
    """Dotted name of the importing module (a package's ``__init__`` goes by the package)."""
    imported: str
    """Dotted name of the imported module."""
    line: int
    """Line of the import statement in the importer's file."""


@dataclass(frozen=True)
class Cycle:
    """Modules that import each other in a ring (a strongly connected component)."""

    files: tuple[Path, ...]
    """The files of the modules, sorted."""
    edges: tuple[Edge, ...]
    """The imports between those modules, sorted."""

    def describe(self, root: Path) -> str:
        """The files and the imports that close the cycle, one per line."""
        files = ", ".join(str(path.relative_to(root)) for path in self.files)
        lines = [f"cycle of {len(self.files)} files: {files}"]
        lines += [f"  {e.importer} -> {e.imported} (line {e.line})" for e in self.edges]
        return "\n".join(lines)


def package_modules(src: Path) -> dict[str, Path]:
    """Dotted module name -> file for every ``*.py`` under a ``src/`` directory."""
    modules = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
    return name == "TYPE_CHECKING"


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement except those in the body of ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            children: list[ast.AST] = list(node.orelse)  # the else branch does run
        else:
            children = [node]
        for child in children:
            yield from _runtime_imports(child)


def module_edges(module: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    """The imports of ``module`` (file ``path``) that name other modules in ``modules``."""
    is_package = path.name == "__init__.py"
    edges: dict[Edge, None] = {}  # ordered set: one edge per statement and target
    for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: strip the module itself, then one package per extra dot
                anchor = module.split(".")[: None if is_package else -1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}" if base else alias.name
                targets.append(submodule if submodule in modules else base)
        for target in targets:
            while target and target not in modules:  # `import a.b.attr`-style spellings
                target = target.rpartition(".")[0]
            if target and target != module:
                edges[Edge(module, target, node.lineno)] = None
    return list(edges)


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the strongly connected components of ``graph``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def find_cycles(src: Path) -> list[Cycle]:
    """Every import cycle between the modules under one package's ``src/`` directory."""
    modules = package_modules(src)
    edges = [edge for name, path in modules.items() for edge in module_edges(name, path, modules)]
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for edge in edges:
        graph[edge.importer].add(edge.imported)
    cycles = []
    for component in _strongly_connected(graph):
        if len(component) > 1:
            members = set(component)
            inner = [e for e in edges if e.importer in members and e.imported in members]
            cycles.append(
                Cycle(
                    files=tuple(sorted(modules[name] for name in component)),
                    edges=tuple(sorted(inner, key=lambda e: (e.importer, e.imported, e.line))),
                )
            )
    return cycles


def workspace_cycles(root: Path) -> list[Cycle]:
    """Import cycles of every ``packages/*/src`` under ``root``."""
    return [cycle for src in sorted(root.glob("packages/*/src")) for cycle in find_cycles(src)]


def main(argv: list[str] | None = None) -> int:
    """Print every import cycle of the workspace; exit status 1 when there is one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="repository root")
    root = parser.parse_args(argv).root.resolve()
    cycles = workspace_cycles(root)
    for cycle in cycles:
        print(cycle.describe(root))
    print(f"{len(cycles)} import cycle(s)" if cycles else "OK: no import cycles")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
