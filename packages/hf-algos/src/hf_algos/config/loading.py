"""Config files on OmegaConf: YAML plus ``key=value`` overrides, typed by our dataclasses.

A trainer's configuration is a tree of small frozen dataclasses (see
:mod:`hf_algos.config.sections`). :func:`compose_config` turns the dataclass into an
OmegaConf structured config and merges, in order, a ``base`` mapping, the YAML file and the
command-line overrides into it; OmegaConf converts every value to the type its field
declares (``lr: 1e-5`` becomes a float) and rejects unknown keys with a "did you mean".
:func:`instantiate_config` resolves ``${...}`` interpolations and builds the frozen
dataclasses, whose ``__post_init__`` checks run before any worker starts.

Override grammar (Hydra's, as verl users type it):

* ``key.sub=value`` sets a key of the schema (the value is parsed as YAML);
* ``+key.sub=value`` adds a key that is not there yet, only inside a free mapping
  (``rollout.engine_kwargs``, ``actor.engine.model.hf_config``, ``vars``);
* ``~key.sub`` drops a key: back to its default (or removed from a free mapping).

YAML 1.1 reads an unquoted ``off`` / ``on`` / ``yes`` / ``no`` as a boolean; where a field's
choices (a ``Literal``) hold such a word, ``mode=off`` means the word, not ``False``.

User variables live in the top-level ``vars:`` mapping (free keys, dropped before the
dataclasses are built), e.g. ``vars: {model: /models/qwen}`` and ``actor.engine.model.path:
${vars.model}``; every other key stays checked against the schema. verl's key paths are
translated by :mod:`hf_algos.config.aliases` in YAML files and overrides alike.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf, TupleConfig, open_dict
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException
from omegaconf.nodes import LiteralNode

from hf_algos.config.aliases import AliasTracker, translate_drop, translate_pair, translate_tree
from hf_controller import ConfigurationError

ConfigT = TypeVar("ConfigT")

VARS_KEY = "vars"
"""Top-level mapping of user variables for ``${vars.name}`` interpolations."""

COMMAND_LINE = "the command line"
"""The source named in errors about overrides."""


def _raise(error: OmegaConfBaseException, source: str) -> typing.NoReturn:
    """Re-raise an OmegaConf error as a :class:`ConfigurationError` naming key and fix."""
    message = str(error).split("\n")[0]
    key = getattr(error, "full_key", None) or ""
    if isinstance(error, MissingMandatoryValue):
        fix = f"set {key}=... (or give the section in the YAML file)"
    elif "not in" in message:
        fix = (
            "check the spelling (`hybridflow <command> --help` lists the sections, "
            "docs/configuration.md every key); use +key=value only inside free mappings"
        )
    else:
        fix = "give a value of the type docs/configuration.md lists for this key"
    where = f" (from {source})" if source else ""
    raise ConfigurationError(f"{key}: {message}{where}; {fix}") from None


def _unfreeze(node: Any) -> None:
    """Clear the read-only flag OmegaConf copies from our frozen dataclasses (recursively),
    so later sources can be merged in; the built dataclasses are frozen again."""
    if isinstance(node, DictConfig | ListConfig):
        OmegaConf.set_readonly(node, None)
        items = node.keys() if isinstance(node, DictConfig) else range(len(node))
        for key in items:
            _unfreeze(node._get_node(key))  # type: ignore[arg-type]


def merge_config(tree: DictConfig, data: Any, source: str) -> DictConfig:
    """``tree`` with ``data`` (a mapping or an OmegaConf tree) merged in, types checked; an
    error names ``source``. The result stays open to further merges."""
    try:
        merged = OmegaConf.merge(tree, data)
    except OmegaConfBaseException as error:
        _raise(error, source)
    assert isinstance(merged, DictConfig)
    _unfreeze(merged)
    return merged


_YAML_BOOL_WORDS = {False: ("off", "no", "false"), True: ("on", "yes", "true")}


def yaml_shorthands(tree: DictConfig, data: Any) -> Any:
    """``data`` (a mapping or an OmegaConf tree) with two YAML shorthands made explicit,
    where ``tree``'s field there asks for it:

    * the booleans that YAML 1.1 made of ``off`` / ``on`` / ``yes`` / ``no`` turned back into
      the word, for a ``Literal`` offering that word (e.g. ``Literal["off", "tis", "mis"]``);
    * a single string for a list field made a one-item list (verl's
      ``train_files: data/train.parquet``); an ``${...}`` interpolation is left to resolve.
    """
    if isinstance(data, DictConfig):
        data = OmegaConf.to_container(data, resolve=False)
    if not isinstance(data, dict) or tree._is_none() or tree._is_missing():
        return data
    fixed = {}
    for key, value in data.items():
        node = tree._get_node(key, throw_on_missing_key=False) if key in tree else None
        if isinstance(node, LiteralNode) and isinstance(value, bool):
            choices = typing.get_args(node._metadata.ref_type)
            value = next((w for w in _YAML_BOOL_WORDS[value] if w in choices), value)
        elif isinstance(node, ListConfig | TupleConfig) and isinstance(value, str):
            value = value if value.startswith("${") else [value]
        elif isinstance(node, DictConfig) and isinstance(value, dict):
            value = yaml_shorthands(node, value)
        fixed[key] = value
    return fixed


def load_mapping(
    path: str | PathLike[str] | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """A YAML file plus ``key=value`` overrides as a plain, resolved dict (no schema).

    For files that hold several configs (a recipe's stages); each part is then built with
    :func:`load_config` (``base=...``).
    """
    tree: Any = OmegaConf.create({}) if path is None else _read_yaml(path)
    for text in overrides:
        key = text.split("=", 1)[0]
        try:
            update = OmegaConf.from_dotlist([text])
            value = OmegaConf.select(update, key, throw_on_resolution_failure=False)
            if isinstance(value, DictConfig):  # a mapping value replaces, as in compose_config
                OmegaConf.update(tree, key, {}, merge=False)
            tree = OmegaConf.merge(tree, update)
        except OmegaConfBaseException as error:
            _raise(error, text)
    try:
        plain = OmegaConf.to_container(tree, resolve=True)
    except OmegaConfBaseException as error:
        _raise(error, str(path or ""))
    assert isinstance(plain, dict)
    return {str(k): v for k, v in plain.items()}


def _read_yaml(path: str | PathLike[str]) -> DictConfig:
    file = Path(path)
    if not file.is_file():
        raise ConfigurationError(f"config file {str(file)!r} does not exist; pass a YAML file path")
    try:
        tree = OmegaConf.load(file)
    except Exception as error:  # a YAML syntax error, with line and column
        raise ConfigurationError(f"config file {str(file)!r} is not valid YAML: {error}") from None
    if not isinstance(tree, DictConfig):
        raise ConfigurationError(f"config file {str(file)!r} must hold a mapping, got a list")
    return tree


def _leaf_mappings(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``data`` split into one nested single-key mapping per leaf (``{"a": {"b": 1}}``)."""
    leaves: list[dict[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            leaves.extend({key: leaf} for leaf in _leaf_mappings(value))
        else:
            leaves.append({key: value})
    return leaves


class _Composer:
    """Merges sources into one typed tree, keeping the user variables beside it."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.tree: DictConfig = OmegaConf.structured(cls)
        _unfreeze(self.tree)
        self.variables: DictConfig = OmegaConf.create({})
        self.aliases = AliasTracker(cls)

    def merge_mapping(self, data: Mapping[str, Any], source: str) -> None:
        """Merge a whole mapping (a YAML file's or ``base``), verl keys translated."""
        plain = dict(data)
        variables = plain.pop(VARS_KEY, None) or {}
        if not isinstance(variables, Mapping):
            raise ConfigurationError(f"{VARS_KEY} in {source} must be a mapping of variables")
        self.variables = OmegaConf.merge(self.variables, variables)  # type: ignore[assignment]
        translated = translate_tree(plain, self.aliases, source)
        try:
            self._merge(translated, source)
        except ConfigurationError as first:  # find every bad key of the source, not one
            problems = []
            for leaf in _leaf_mappings(translated):
                try:
                    self._merge(leaf, source)
                except ConfigurationError as error:
                    problems.append(error)
            raise_together(problems or [first])

    def _merge(self, data: Any, source: str) -> None:
        self.tree = merge_config(self.tree, yaml_shorthands(self.tree, data), source)

    def apply_override(self, text: str) -> None:
        """Apply one command-line override (``key=value``, ``+key=value`` or ``~key``)."""
        body = text.strip()
        # Hydra's forms: +key adds, ++key sets or adds (here: sets, adding in free mappings)
        dropping, forcing = body.startswith("~"), body.startswith("++")
        adding = body.startswith("+") and not forcing
        key, sep, raw = body.lstrip("~+").partition("=")
        if (not sep and not dropping) or not key or any(not p for p in key.split(".")):
            raise ConfigurationError(
                f"override {text!r} is not of the form key.sub=value, +key.sub=value or "
                "~key.sub (e.g. actor.engine.optim.lr=1e-6)"
            )
        if key.split(".")[0] == VARS_KEY:
            self._set_variable(key, raw, dropping, text)
            return
        if dropping:
            for ours in translate_drop(key, self.cls.__name__):
                self._drop(ours, text)
            return
        for ours, value in translate_pair(key, raw, self.aliases, COMMAND_LINE):
            if adding:
                self._check_addable(ours, text)
            value = self._as_list(ours, value)
            try:
                update = OmegaConf.from_dotlist([f"{ours}={value}"])
            except OmegaConfBaseException as error:
                _raise(error, text)
            self._clear_free_mapping(
                ours, OmegaConf.select(update, ours, throw_on_resolution_failure=False)
            )
            self._merge(update, text)

    def _clear_free_mapping(self, key: str, value: Any) -> None:
        """``key={...}`` on a free mapping replaces it (``rollout.engine_kwargs={}`` empties
        it) where a merge would keep its old keys; sections of the schema still merge."""
        if not isinstance(value, DictConfig):
            return
        parent, leaf = self._parent(key)
        node = parent._get_node(leaf) if isinstance(parent, DictConfig) else None
        if isinstance(node, DictConfig) and not dataclasses.is_dataclass(OmegaConf.get_type(node)):
            parent[leaf] = {}

    def _as_list(self, key: str, raw: str) -> str:
        """A bare value for a list key is a list (verl's ``data.train_files=a.parquet``,
        ``trainer.loggers=console,jsonl``)."""
        text = raw.strip()
        if text.startswith(("[", "$")) or text in ("null", "~"):
            return raw
        try:
            node = OmegaConf.select(self.tree, key, default=None, throw_on_missing=False)
            if node is None:  # an optional list now null (reward.function_weights=0.5)
                parent, leaf = self._parent(key)
                node = parent._get_node(leaf) if isinstance(parent, DictConfig) else None
        except (OmegaConfBaseException, AttributeError):  # below a section still missing
            return raw
        return f"[{text}]" if isinstance(node, ListConfig | TupleConfig) else raw  # "" -> []

    def _set_variable(self, key: str, raw: str, dropping: bool, text: str) -> None:
        name = key[len(VARS_KEY) + 1 :]
        if not name:
            raise ConfigurationError(f"override {text!r}: name the variable, e.g. vars.model=...")
        if dropping:
            self.variables.pop(name, None)
            return
        try:
            update = OmegaConf.from_dotlist([f"{name}={raw}"])
        except OmegaConfBaseException as error:
            _raise(error, text)
        self.variables = OmegaConf.merge(self.variables, update)  # type: ignore[assignment]

    def _parent(self, key: str) -> tuple[Any, str]:
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(self.tree, parent_key) if parent_key else self.tree
        return parent, leaf

    def _check_addable(self, key: str, text: str) -> None:
        parent, leaf = self._parent(key)
        typed = isinstance(parent, DictConfig) and dataclasses.is_dataclass(
            OmegaConf.get_type(parent)
        )
        if typed and leaf not in parent:
            section = OmegaConf.get_type(parent)
            name = section.__name__ if isinstance(section, type) else "the schema"
            close = difflib.get_close_matches(leaf, [str(k) for k in parent], n=1)
            prefix = key.rpartition(".")[0]
            hint = f" (did you mean {prefix + '.' if prefix else ''}{close[0]}?)" if close else ""
            raise ConfigurationError(
                f"override {text!r}: {key} is not a key of {name}{hint}, and +key adds keys "
                "only inside free mappings "
                "(rollout.engine_kwargs, model.hf_config, vars); `hybridflow <command> --help` "
                "lists the sections, docs/configuration.md every key"
            )
        if typed or (isinstance(parent, DictConfig) and leaf in parent):
            raise ConfigurationError(
                f"override {text!r}: +key adds a key that is not there yet inside a free "
                f"mapping (rollout.engine_kwargs, model.hf_config, vars); {key} is "
                f"{'a key of the schema' if typed else 'already set'}: use {key}=... "
                f"(or ++{key}=...) instead"
            )

    def _drop(self, key: str, text: str) -> None:
        parent, leaf = self._parent(key)
        if not isinstance(parent, DictConfig) or leaf not in parent:
            raise ConfigurationError(f"override {text!r}: there is no key {key} to drop")
        kind = OmegaConf.get_type(parent)
        if dataclasses.is_dataclass(kind) and isinstance(kind, type):
            default = OmegaConf.structured(kind)._get_node(leaf)
            OmegaConf.update(self.tree, key, default, merge=False)
        else:
            del parent[leaf]
        _unfreeze(self.tree)

    def finish(self) -> DictConfig:
        """The merged tree with verl aliases that depend on several keys settled."""
        for key, value in self.aliases.derived(self.tree).items():
            self._merge(OmegaConf.from_dotlist([f"{key}={value}"]), "verl aliases")
        with open_dict(self.tree):
            self.tree[VARS_KEY] = self.variables
        return self.tree


def compose_config(
    cls: type,
    path: str | PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    base: Mapping[str, Any] | None = None,
) -> DictConfig:
    """Merge ``base``, the YAML at ``path`` and ``overrides`` into the schema of ``cls``.

    Returns the typed (not yet resolved) OmegaConf tree, user ``vars`` included; later
    sources win key by key. Unknown keys and values of the wrong type are refused here.
    """
    composer = _Composer(cls)
    if base:
        composer.merge_mapping(base, "base config")
    if path is not None:
        tree = OmegaConf.to_container(_read_yaml(path), resolve=False)
        assert isinstance(tree, dict)
        composer.merge_mapping({str(k): v for k, v in tree.items()}, str(path))
    for text in overrides:
        composer.apply_override(str(text))
    return composer.finish()


def resolve_config(tree: DictConfig) -> DictConfig:
    """A copy of ``tree`` with every ``${...}`` resolved and the ``vars`` mapping removed.

    Custom resolvers must be registered first: ``hybridflow`` registers the packaged
    examples' (:func:`hf_algos.examples.register_resolvers`)."""
    resolved = tree.copy()
    try:
        OmegaConf.resolve(resolved)
    except OmegaConfBaseException as error:
        _raise(error, "an interpolation ${...}")
    with open_dict(resolved):
        resolved.pop(VARS_KEY, None)
    return resolved


def instantiate_config(cls: type[ConfigT], tree: DictConfig) -> ConfigT:
    """Resolve ``tree`` and build the frozen dataclass ``cls`` (running every check)."""
    built = _build(cls, resolve_config(tree), "")
    assert isinstance(built, cls)
    return built


def raise_together(problems: Sequence[ConfigurationError]) -> typing.NoReturn:
    """Raise one :class:`ConfigurationError` for all of ``problems`` (one message per line)."""
    if len(problems) == 1:
        raise problems[0]
    lines = "\n".join(f"  - {problem}" for problem in problems)
    raise ConfigurationError(f"{len(problems)} problems:\n{lines}") from None


def _build_field(node: DictConfig, name: str, hint: Any, where: str) -> Any:
    """The value of field ``name`` of ``node``: a built section, ``None`` or a plain value."""
    path = f"{where}.{name}" if where else name
    child = node._get_node(name)
    if OmegaConf.is_missing(node, name):
        raise ConfigurationError(
            f"missing required key {path}; set it in the YAML file or with "
            f"{path}.<key>=... on the command line"
        )
    kind = OmegaConf.get_type(child) if isinstance(child, DictConfig) else None
    if isinstance(child, DictConfig) and dataclasses.is_dataclass(kind) and child._is_none():
        return None
    if isinstance(child, DictConfig) and dataclasses.is_dataclass(kind):
        assert isinstance(kind, type)
        return _build(kind, child, path)
    value = OmegaConf.to_object(child) if isinstance(child, DictConfig | ListConfig) else node[name]
    if isinstance(value, list) and _is_tuple(hint):
        value = tuple(value)
    return value


def _build(cls: type, node: DictConfig, where: str) -> Any:
    """Build dataclass ``cls`` from a typed node; an error names the dotted section."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    problems: list[ConfigurationError] = []  # the root's sections, all checked before raising
    for field in dataclasses.fields(cls):
        try:
            kwargs[field.name] = _build_field(node, field.name, hints[field.name], where)
        except ConfigurationError as error:
            if where:
                raise
            problems.append(error)
    if problems:
        raise_together(problems)
    try:
        return cls(**kwargs)
    except ConfigurationError as error:
        text = str(error)
        if where and not text.startswith(where) and f" {where}." not in text:
            raise ConfigurationError(f"in {where}: {text}") from None
        raise


def _is_tuple(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    options = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    return any(o is tuple or typing.get_origin(o) is tuple for o in options)


def load_config(
    cls: type[ConfigT],
    path: str | PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    base: Mapping[str, Any] | None = None,
) -> ConfigT:
    """Build config ``cls`` from ``base`` (a mapping), then the YAML at ``path``, then
    ``overrides`` (``key=value``, ``+key=value``, ``~key``); see the module docstring."""
    return instantiate_config(cls, compose_config(cls, path, overrides, base))


def config_to_dict(config: Any) -> Any:
    """The plain-data form of a config tree (for logging, YAML dumps and checkpoints)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: config_to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, Mapping):
        return {str(k): config_to_dict(v) for k, v in config.items()}
    if isinstance(config, Sequence) and not isinstance(config, str | bytes):
        # tuples, lists, and OmegaConf's ListConfig / TupleConfig (a typed tuple field stays
        # one after loading; str() of it would end up in config.yaml as "('a',)")
        return [config_to_dict(v) for v in config]
    return config
