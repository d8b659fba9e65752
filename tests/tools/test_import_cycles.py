"""No package of the workspace has import cycles between its files (tools/import_graph.py)."""

from __future__ import annotations

from pathlib import Path

import import_graph


def test_workspace_packages_have_no_import_cycles() -> None:
    cycles = import_graph.workspace_cycles(import_graph.REPO_ROOT)
    report = "\n".join(cycle.describe(import_graph.REPO_ROOT) for cycle in cycles)
    assert not cycles, f"import cycles between files of a package:\n{report}"


def write(root: Path, files: dict[str, str]) -> Path:
    """Write ``{relative path: source}`` under ``root/packages/hf-demo/src`` and return it."""
    src = root / "packages" / "hf-demo" / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text, encoding="utf-8")
    return src


def cycle_modules(src: Path) -> list[list[str]]:
    """Each cycle's module files, relative to ``src``, as sorted lists."""
    cycles = import_graph.find_cycles(src)
    return [sorted(str(path.relative_to(src)) for path in cycle.files) for cycle in cycles]


def test_a_lazy_import_still_closes_a_cycle(tmp_path: Path) -> None:
    src = write(
        tmp_path,
        {
            "demo/__init__.py": "",
            "demo/a.py": "from demo.b import g\n",
            "demo/b.py": "def g():\n    from . import a\n    return a\n",
        },
    )
    assert cycle_modules(src) == [["demo/a.py", "demo/b.py"]]
    assert "demo.b -> demo.a (line 2)" in import_graph.find_cycles(src)[0].describe(src)


def test_type_checking_imports_and_parent_packages_are_not_edges(tmp_path: Path) -> None:
    src = write(
        tmp_path,
        {
            "demo/__init__.py": "from demo.core import Thing\nfrom demo.sub import helper\n",
            "demo/core.py": "from demo.sub.helper import h\n\nclass Thing: ...\n",
            "demo/sub/__init__.py": "",
            "demo/sub/helper.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from demo.core import Thing\n"
                "def h(x: 'Thing') -> None: ...\n"
            ),
        },
    )
    assert cycle_modules(src) == []


def test_importing_a_name_from_the_package_init_is_an_edge_to_it(tmp_path: Path) -> None:
    src = write(
        tmp_path,
        {
            "demo/__init__.py": "from demo.core import Thing\n",
            "demo/core.py": "from demo.util import x\n\nclass Thing: ...\n",
            "demo/util.py": "from demo import Thing\nx = 1\n",
        },
    )
    assert cycle_modules(src) == [["demo/__init__.py", "demo/core.py", "demo/util.py"]]
