"""Config files: YAML plus ``key.sub=value`` command-line overrides, typed by the dataclasses.

A trainer's configuration is a tree of small frozen dataclasses (see
:mod:`hf_algos.config.sections`). :func:`load_config` reads a YAML file, applies dotted
overrides, converts every leaf to the type its field declares (so ``lr: 1e-5``, which YAML
reads as a string, becomes a float) and builds the tree with
:func:`hf_engines.config.config_from_dict`, which rejects unknown keys and lists the valid
ones. Cross-section checks (batch sizes that must divide) live in
:mod:`hf_algos.config.validation` and run before any worker starts.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

import yaml

from hf_controller import ConfigurationError
from hf_engines.config import config_from_dict

ConfigT = TypeVar("ConfigT")

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NONE = {"null", "none", "~", ""}


def read_yaml(path: str | PathLike[str]) -> dict[str, Any]:
    """Read a YAML mapping from ``path``; an empty file is an empty mapping."""
    file = Path(path)
    if not file.is_file():
        raise ConfigurationError(f"config file {str(file)!r} does not exist; pass a YAML file path")
    data = yaml.safe_load(file.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigurationError(f"config file {str(file)!r} must hold a mapping, got {type(data)}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``"a.b.c=value"`` into ``(["a", "b", "c"], value)``; the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
        raise ConfigurationError(
            f"override {text!r} is not of the form key.sub=value (e.g. actor.engine.optim.lr=1e-6)"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # a plain string such as "a: b" that is not valid YAML on its own
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with every ``key.sub=value`` override set (creating levels)."""
    result = _deep_copy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = result
        for depth, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                raise ConfigurationError(
                    f"override {text!r}: {where} is a value ({child!r}), not a section; "
                    f"set {where}=... instead"
                )
            node = child
        node[path[-1]] = value
    return result


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def coerce_to_fields(cls: type, data: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """Convert the values of ``data`` to the types the fields of dataclass ``cls`` declare.

    Nested dataclass sections recurse; unknown keys are kept for
    :func:`~hf_engines.config.config_from_dict` to report with the list of valid keys.
    """
    if not isinstance(data, Mapping):
        raise ConfigurationError(f"{where or cls.__name__} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    result: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        result[key] = coerce_value(value, hints[key], path) if key in names else value
    return result


def coerce_value(value: Any, hint: Any, where: str) -> Any:
    """Convert ``value`` to the type ``hint`` (as written in a config dataclass) or raise."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any or hint is object:
        return value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return build_config(hint, value, where) if isinstance(value, Mapping) else value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, args, where)
    if origin is typing.Literal:
        return _coerce_literal(value, args, where)
    if origin in (list, tuple, Sequence) or hint in (list, tuple):
        return _coerce_sequence(value, hint, origin, args, where)
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise ConfigurationError(f"{where}={value!r} must be a mapping (key: value pairs)")
        return dict(value)
    if hint in (bool, int, float, str):
        return _coerce_scalar(value, hint, where)
    return value


def _coerce_union(value: Any, args: tuple[Any, ...], where: str) -> Any:
    if type(None) in args and (value is None or (isinstance(value, str) and value in _NONE)):
        return None
    errors = []
    for arg in (a for a in args if a is not type(None)):
        try:
            return coerce_value(value, arg, where)
        except ConfigurationError as error:
            errors.append(str(error))
    raise ConfigurationError("; ".join(errors))


def _coerce_literal(value: Any, choices: tuple[Any, ...], where: str) -> Any:
    for choice in choices:
        if value == choice or (isinstance(value, str) and str(choice) == value):
            return choice
    raise ConfigurationError(f"{where}={value!r} is not one of {', '.join(map(repr, choices))}")


def _coerce_sequence(value: Any, hint: Any, origin: Any, args: tuple[Any, ...], where: str) -> Any:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",")] if value.strip() else []
    if not isinstance(value, list | tuple):
        value = [value]
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            raise ConfigurationError(f"{where}={value!r} needs exactly {len(args)} values")
        return tuple(
            coerce_value(v, a, f"{where}[{i}]")
            for i, (v, a) in enumerate(zip(value, args, strict=True))
        )
    item = args[0] if args else Any
    items = [coerce_value(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    return tuple(items) if origin is tuple or hint is tuple else items


def _coerce_scalar(value: Any, kind: type, where: str) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
        raise ConfigurationError(f"{where}={value!r} is not a boolean; use true or false")
    if kind is str:
        if isinstance(value, Mapping | list | tuple):
            raise ConfigurationError(f"{where}={value!r} must be a string")
        return str(value)
    if isinstance(value, bool):
        raise ConfigurationError(f"{where}={value!r} must be a number, not a boolean")
    try:
        number = float(value) if kind is float else _to_int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{where}={value!r} is not a valid {kind.__name__}") from None
    return number


def _to_int(value: Any) -> int:
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(value)
        return int(value)
    text = str(value).strip()
    try:
        return int(text)
    except ValueError:
        as_float = float(text)  # "1e3" is a fine integer
        if not as_float.is_integer():
            raise
        return int(as_float)


def build_config(cls: type[ConfigT], data: Mapping[str, Any], where: str = "") -> ConfigT:
    """Build dataclass ``cls`` from a plain mapping: typed conversion, then validation.

    Nested sections (also optional ones, ``Section | None``) are built first, so an error
    names the full dotted key (``actor.engine.optim.lr``).
    """
    kwargs = coerce_to_fields(cls, data, where)
    try:
        return config_from_dict(cls, kwargs, where)
    except ConfigurationError as error:
        if where and not str(error).startswith(where) and f" {where}." not in str(error):
            raise ConfigurationError(f"in {where}: {error}") from None
        raise


def load_config(
    cls: type[ConfigT],
    path: str | PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    base: Mapping[str, Any] | None = None,
) -> ConfigT:
    """Build config ``cls`` from ``base`` (a mapping), then the YAML at ``path``, then overrides.

    Later sources win key by key (sections merge, values replace).
    """
    data: dict[str, Any] = _deep_copy(base or {})
    if path is not None:
        data = merge(data, read_yaml(path))
    return build_config(cls, apply_verl_aliases(apply_overrides(data, overrides)))


def apply_verl_aliases(data: dict[str, Any]) -> dict[str, Any]:
    """Translate verl's keys that mean the same thing as ours (in place; returns ``data``).

    ``trainer.n_gpus_per_node=k`` becomes ``trainer.n_workers = k * trainer.nnodes``
    (``n_workers`` is our total over all nodes); giving both with different meanings is an
    error naming the two values.
    """
    trainer = data.get("trainer")
    if not isinstance(trainer, dict) or "n_gpus_per_node" not in trainer:
        return data
    try:
        per_node = _to_int(trainer.pop("n_gpus_per_node"))
        nnodes = _to_int(trainer.get("nnodes", 1))
    except ValueError as error:
        raise ConfigurationError(
            f"trainer.n_gpus_per_node and trainer.nnodes must be whole numbers, got {error}"
        ) from None
    total = per_node * nnodes
    if "n_workers" in trainer and _to_int(trainer["n_workers"]) != total:
        raise ConfigurationError(
            f"trainer.n_gpus_per_node={per_node} x trainer.nnodes={nnodes} = {total} workers, "
            f"but trainer.n_workers={trainer['n_workers']} (the total over all nodes); set only "
            f"one of them"
        )
    trainer["n_workers"] = total
    return data


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Recursively merge ``update`` into a copy of ``base`` (mappings merge, others replace)."""
    result = _deep_copy(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = _deep_copy(value) if isinstance(value, Mapping) else value
    return result


def config_to_dict(config: Any) -> Any:
    """The plain-data form of a config tree (for logging, YAML dumps and checkpoints)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: config_to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, Mapping):
        return {str(k): config_to_dict(v) for k, v in config.items()}
    if isinstance(config, list | tuple):
        return [config_to_dict(v) for v in config]
    return config
