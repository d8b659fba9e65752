"""Command-line overrides: the grammar, parsed, and what each form does to an OmegaConf tree.

An override is one of

* ``key.sub=value``: set a key that is there;
* ``+key.sub=value``: add a key that is not there (or has no value);
* ``++key.sub=value``: set a key, adding it if it is not there;
* ``~key.sub``: remove a key.

The value is read as YAML flow text, as :meth:`omegaconf.OmegaConf.from_dotlist` reads it,
but with YAML 1.2's plain words (as verl users' Hydra read them): ``16`` and ``1e-6`` are
numbers, ``true`` / ``false`` booleans, ``null`` nothing, ``off`` / ``yes`` words; ``[a,b]``
is a list, ``{k: v}`` a mapping, ``'a b'`` or ``"a b"`` a string; an empty value (``key=``)
is the empty string. ``${...}``
interpolations are kept as text, also inside a list. Outside quotes a value holds letters,
digits, spaces and ``_/-\\+.$%*@?|:``; anything else (``~/data``, ``#``, ``=``) must be quoted.
An unbracketed ``a,b`` is refused as ambiguous (a list is ``[a,b]``, a string ``'a,b'``),
except for the keys a caller names (verl's ``data.train_files=a.parquet,b.parquet``).

:func:`apply_override` gives the forms their meaning on a tree: setting a key that is not
there is refused, naming ``+key``, and so is adding one that has a value, naming ``++key``.
The schema's own rules (a key of a dataclass goes back to its default, verl's keys) are
:mod:`hf_algos.config.loading`'s.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from hf_controller import ConfigurationError

Action = Literal["set", "add", "force", "drop"]

_KEY = re.compile(r"[\w$-]+(?:\.[\w$-]+)*")
_PLAIN = frozenset("_/-\\+.$%*@?|:")
"""Characters besides letters, digits and spaces a value may hold outside quotes."""
_QUOTE_HINT = (
    "quote a value with spaces or special characters: key='a b', "
    "data.train_files=['~/data/train.parquet']"
)


@dataclass(frozen=True)
class Override:
    """One parsed override."""

    text: str
    """The override as given (errors quote it)."""
    action: Action
    """``set`` (``key=v``), ``add`` (``+key=v``), ``force`` (``++key=v``), ``drop`` (``~key``)."""
    key: str
    """The dotted key path."""
    value: Any = None
    """The parsed value (``None`` for ``drop``)."""


class _ValueLoader(yaml.SafeLoader):
    """YAML for override values: YAML 1.2's plain scalars (``off`` is a word, ``010`` and
    ``1:2`` are not numbers, ``2024-01-01`` not a date), ``1e-6`` a float as in OmegaConf."""


_ValueLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in (
    ("null", r"null|Null|NULL|", ("n", "N", "")),
    ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("int", r"[-+]?(?:0|[1-9][0-9_]*)", "-+0123456789"),
    (
        "float",
        r"[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|\.(?:inf|Inf|INF))|\.(?:nan|NaN|NAN)",
        "-+0123456789.",
    ),
):
    _ValueLoader.add_implicit_resolver(
        f"tag:yaml.org,2002:{_tag}", re.compile(f"^(?:{_pattern})$"), list(_first)
    )
_ACTIONS: dict[str, Action] = {"~": "drop", "+": "add", "++": "force", "": "set"}


def _closing(text: str, start: int) -> int:
    """The index of what closes the quote or ``${`` opened at ``start``."""
    if text[start] in "'\"":
        end = start + 1
        while end < len(text) and text[end] != text[start]:
            end += 2 if text[end] == "\\" else 1
    else:  # an interpolation: its braces nest
        depth, end = 0, start + 1
        while end < len(text) and (depth := depth + {"{": 1, "}": -1}.get(text[end], 0)):
            end += 1
    if end >= len(text):
        raise ValueError(f"{text[start:]!r} is not closed")
    return end


def _scan(text: str) -> tuple[str, bool]:
    """``text`` ready for YAML (interpolations inside brackets quoted, where YAML would read
    their braces) and whether it holds a comma outside brackets, quotes and interpolations."""
    out: list[str] = []
    depth, index, top_comma = 0, 0, False
    while index < len(text):
        char = text[index]
        if char in "'\"" or text.startswith("${", index):
            end = _closing(text, index) + 1
            chunk = text[index:end]
            quote = depth and char == "$"
            out.append("'" + chunk.replace("'", "''") + "'" if quote else chunk)
            index = end
            continue
        depth += 1 if char in "[{" else -1 if char in "]}" else 0
        top_comma = top_comma or (char == "," and depth == 0)
        if not (char.isalnum() or char.isspace() or char in _PLAIN or char in "[]{},"):
            raise ValueError(f"{char!r} must be quoted")
        out.append(char)
        index += 1
    return "".join(out), top_comma


def parse_value(text: str, comma_list: bool = False) -> Any:
    """The value of an override's ``text`` after ``=`` (see the module docstring); an
    unbracketed ``a,b`` is the list ``[a, b]`` when ``comma_list``, else a ``ValueError``."""
    text = text.strip()
    if not text:
        return ""
    source, top_comma = _scan(text)
    if top_comma and not comma_list:
        raise ValueError("ambiguous")
    value = yaml.load(f"[{source}]" if top_comma else source, Loader=_ValueLoader)
    if isinstance(value, dict | list) and not top_comma and text[0] not in "[{":
        return text  # "a: b" or "- a": words here, not a YAML mapping or list
    return value


def _shape_problem(key: str, drop: bool, equals: str, raw: str) -> str:
    """What is wrong with an override's shape ("" if nothing)."""
    if not _KEY.fullmatch(key):
        return f"{key!r} is not a dotted key (key.sub)"
    if drop and raw.strip():
        return "~key takes no value"
    if not (drop or equals):
        return "expected key=value, +key=value, ++key=value or ~key"
    return ""


def parse_override(text: str, comma_lists: Collection[str] = ()) -> Override:
    """One override parsed; an error names it and the fix. An unbracketed ``a,b`` is a list
    for the keys in ``comma_lists``."""
    drop = text.startswith("~")
    prefix = "~" if drop else "++" if text.startswith("++") else "+" if text[:1] == "+" else ""
    key, equals, raw = text[len(prefix) :].partition("=")
    key = key.strip()
    if not key and equals:
        raise ConfigurationError(f"override {text!r} names no key; write key.sub=value")
    problem = _shape_problem(key, drop, equals, raw)
    value = None
    try:
        value = None if drop or problem else parse_value(raw, key in comma_lists)
    except (ValueError, yaml.YAMLError) as error:
        if str(error) == "ambiguous":
            raise ConfigurationError(
                f"Ambiguous value for argument {text!r}: a list is written key=[a,b], "
                "a string with commas is quoted: key='a,b'"
            ) from None
        problem = getattr(error, "problem", None) or str(error).split("\n")[0]
    if problem:
        raise ConfigurationError(f"override {text!r} does not parse: {problem} ({_QUOTE_HINT})")
    return Override(text, _ACTIONS[prefix], key, value)


def parse_overrides(texts: Sequence[str], comma_lists: Collection[str] = ()) -> list[Override]:
    """Every override parsed (all of them before any is applied)."""
    return [parse_override(str(text), comma_lists) for text in texts]


def _find(tree: DictConfig, key: str) -> tuple[DictConfig, bool]:
    """The deepest mapping on ``key``'s path in ``tree``, and whether ``key`` is there."""
    node, parts = tree, key.split(".")
    for index, part in enumerate(parts):
        if part not in node.keys():  # noqa: SIM118 (`in` is False for a ??? value)
            return node, False
        if index == len(parts) - 1:
            return node, True
        if OmegaConf.is_missing(node, part) or OmegaConf.is_interpolation(node, part):
            return node, False
        child = node[part]
        if not isinstance(child, DictConfig):
            return node, False
        node = child
    return node, False


def apply_override(tree: DictConfig, override: Override, replace: bool = False) -> None:
    """Apply ``override`` to ``tree`` in place. A mapping value is merged into the mapping
    there, or replaces it when ``replace``. Raises :class:`ConfigurationError` for a
    misused form and OmegaConf's errors for a value or key of the wrong type."""
    key, text, value = override.key, override.text, override.value
    parent, present = _find(tree, key)
    if override.action == "drop":
        if not present:
            raise ConfigurationError(f"Could not delete from config. {key!r} does not exist.")
        with open_dict(parent):
            del parent[key.rpartition(".")[2]]
        return
    if override.action == "add" and not isinstance(value, dict | list):
        selected = OmegaConf.select(
            tree, key, throw_on_missing=False, throw_on_resolution_failure=False
        )
        if present and selected is not None:
            raise ConfigurationError(
                f"Could not append to config. An item is already at {key!r}. Either remove "
                f"+ prefix: {text[1:]!r}, or add a second + to add or override {key!r}: "
                f"{'+' + text!r}"
            )
    is_schema = OmegaConf.get_type(parent) not in (dict, None)
    if override.action == "set" and not present and not is_schema:  # else OmegaConf refuses
        raise ConfigurationError(
            f"{key}: Could not override {key!r}: it is not there; to add it to a free mapping "
            f"use +{text}"
        )
    merge = not (replace and isinstance(value, dict))
    OmegaConf.update(tree, key, value, merge=merge, force_add=override.action != "set")
