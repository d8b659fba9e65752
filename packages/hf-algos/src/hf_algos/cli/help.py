"""The ``--help`` text of a training command: its config sections, one line each.

Field docstrings are attribute docstrings (a string right after the field), which Python
drops at run time, so they are read from the class source (installed with the package).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from pathlib import Path


def field_docs(cls: type) -> dict[str, str]:
    """``field name -> docstring`` of dataclass ``cls`` (fields without one are left out)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (e.g. a class made at run time)
        return {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for node, after in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _section_class(hint: object) -> type | None:
    """The dataclass a field holds (also through ``X | None``), else ``None``."""
    options = (
        typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else (hint,)
    )
    for option in options:
        if isinstance(option, type) and dataclasses.is_dataclass(option):
            return option
    return None


def _first_sentence(text: str) -> str:
    line = " ".join(text.split())
    return line.split(". ")[0].rstrip(".") + "."


def describe_sections(cls: type) -> str:
    """One line per top-level key of root config ``cls``: the key, then what it holds."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    lines = []
    for field in dataclasses.fields(cls):
        section = _section_class(hints[field.name])
        text = docs.get(field.name, "")
        if section is not None and section.__doc__:
            text = _first_sentence(section.__doc__)
        kind = "section" if section is not None else "value"
        lines.append(f"  {field.name:<20} {kind:<8} {_first_sentence(text) if text else ''}")
    return "\n".join(lines)


def packaged_configs(directory: Path) -> list[str]:
    """Names of the YAML configs shipped in ``directory`` (for ``--config-name``)."""
    return sorted(p.stem for p in directory.glob("*.yaml"))
