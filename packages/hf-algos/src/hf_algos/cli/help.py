"""The ``--help`` text of a training command: its config sections, one line each.

Field descriptions come from :mod:`hf_algos.config.docstrings`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

from hf_algos.config.docstrings import attribute_docstrings


def field_docs(cls: type) -> dict[str, str]:
    """``field name -> docstring`` on one line, of dataclass ``cls`` (fields without one are
    left out; a class without source, e.g. made at run time, has none)."""
    try:
        docs = attribute_docstrings(cls)
    except (OSError, TypeError):
        return {}
    return {name: " ".join(text.split()) for name, text in docs.items()}


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
