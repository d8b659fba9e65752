"""Config files on OmegaConf: YAML plus ``key=value`` overrides, typed by our dataclasses.

A trainer's configuration is a tree of small frozen dataclasses (see
:mod:`hf_algos.config`, one module per section). :func:`compose_config` turns the dataclass into an
OmegaConf structured config and merges, in order, a ``base`` mapping, the YAML file and the
command-line overrides into it; OmegaConf converts every value to the type its field
declares (``lr: 1e-5`` becomes a float) and rejects unknown keys with a "did you mean".
:func:`instantiate_config` resolves ``${...}`` interpolations and builds the frozen
dataclasses, whose ``__post_init__`` checks run before any worker starts. Only OmegaConf's
public API is used; a field's declared type is read from the dataclasses themselves.

Command-line overrides (:mod:`hf_algos.config.overrides`: the grammar and its errors) are
applied in order to the tree merged so far (``key=[a,b]``, ``key={k: v}``, ``key='a b'``,
``key=null``):

* ``key.sub=value`` sets a key of the schema (a bare value for a list key is a one-item list,
  ``data.train_files=a.parquet``; an empty one, ``data.val_files=``, the empty list; verl's
  ``data.train_files=a.parquet,b.parquet`` a list of both);
* ``+key.sub=value`` adds a key that is not there yet, and ``++key.sub=value`` sets a key or
  adds it; both add keys only inside free mappings (``rollout.engine_kwargs``,
  ``actor.engine.model.hf_config``, ``vars``): a misspelt key of the schema is refused with
  a "did you mean";
* ``~key.sub`` drops a key: a key of the schema goes back to its default, a key of a free
  mapping is removed;
* ``free.mapping={k: v}`` replaces a free mapping (``rollout.engine_kwargs={}`` empties it);
  ``section={k: v}`` merges into a section; ``vars.name=value`` sets a variable or adds it.

YAML 1.1 reads an unquoted ``off`` / ``on`` / ``yes`` / ``no`` in a file as a boolean; where a
field's choices (a ``Literal``) hold such a word, ``mode: off`` means the word, not ``False``
(an override's ``mode=off`` is the word already: overrides read YAML 1.2's plain words).

User variables live in the top-level ``vars:`` mapping (free keys, dropped before the
dataclasses are built), e.g. ``vars: {model: /models/qwen}`` and ``actor.engine.model.path:
${vars.model}``; every other key stays checked against the schema. verl's key paths are
translated by :mod:`hf_algos.config.aliases` in YAML files and overrides alike
(``hybridflow convert-verl`` translates a verl file once: :mod:`hf_algos.config.convert_verl`).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
import warnings
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from hf_algos.config.aliases import (
    AliasTracker,
    VerlKeysNoEffect,
    no_effect_message,
    translate_drop,
    translate_tree,
    translate_value,
)
from hf_algos.config.overrides import Override, apply_override, parse_overrides
from hf_controller import ConfigurationError

ConfigT = TypeVar("ConfigT")

VARS_KEY = "vars"
"""Top-level mapping of user variables for ``${vars.name}`` interpolations."""

COMMAND_LINE = "the command line"
"""The source named in errors about overrides."""

COMMA_LIST_KEYS = ("data.train_files", "data.val_files")
"""List keys whose unbracketed ``a,b`` value is the list ``[a,b]`` (verl's scripts write the
data files so); elsewhere it is refused as ambiguous."""


def _fix(error: OmegaConfBaseException, key: str) -> str:
    """What to do about an OmegaConf error at ``key``."""
    if isinstance(error, MissingMandatoryValue):
        return f"set {key}=... (or give the section in the YAML file)"
    if "not in" in str(error).split("\n")[0]:
        return (
            "check the spelling (`hybridflow <command> --help` lists the sections, "
            "docs/configuration.md every key)"
        )
    return "give a value of the type docs/configuration.md lists for this key"


def _raise(error: OmegaConfBaseException, source: str) -> typing.NoReturn:
    """Re-raise an OmegaConf error as a :class:`ConfigurationError` naming key and fix."""
    message = str(error).split("\n")[0]
    key = getattr(error, "full_key", None) or ""
    where = f" (from {source})" if source else ""
    raise ConfigurationError(f"{key}: {message}{where}; {_fix(error, key)}") from None


def _options(hint: Any) -> tuple[Any, ...]:
    """The types a hint allows (``X | None`` -> ``X``, ``None``)."""
    origin = typing.get_origin(hint)
    return typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)


def _is_hint(hint: Any, *kinds: Any) -> bool:
    """Whether type hint ``hint`` allows a value of one of ``kinds`` (``tuple[str, ...]``)."""
    return any(o in kinds or typing.get_origin(o) in kinds for o in _options(hint))


def _section(hint: Any) -> type | None:
    """The dataclass a hint allows (``Section | None`` -> ``Section``), if any."""
    return next(
        (o for o in _options(hint) if isinstance(o, type) and dataclasses.is_dataclass(o)), None
    )


def _field_names(section: type | None) -> list[str]:
    return [f.name for f in dataclasses.fields(section)] if section is not None else []


def _schema_field(cls: type, key: str) -> tuple[type | None, Any]:
    """The section (dataclass) of schema ``cls`` that holds dotted ``key``, and the key's type
    hint; ``(None, None)`` below a free mapping. Read from the schema, not the tree, so an
    override is checked before the overrides ahead of it are applied."""
    *parents, leaf = key.split(".")
    section: type | None = cls
    for part in parents:
        hints = typing.get_type_hints(section) if part in _field_names(section) else {}
        section = _section(hints.get(part))
        if section is None:
            return None, None
    return section, typing.get_type_hints(section).get(leaf)


def _as_list(value: Any, hint: Any) -> Any:
    """A bare value for a list key as a one-item list (``""``: the empty list); a list,
    mapping, null or ``${...}`` interpolation stays as it is."""
    one_string = isinstance(value, str) and _is_hint(hint, str)  # `str | tuple[str, ...]`
    if not _is_hint(hint, list, tuple) or one_string:
        return value
    if isinstance(value, str):
        return [] if value == "" else value if value.startswith("${") else [value]
    return [value] if isinstance(value, int | float) else value


def _unfreeze(node: Any) -> None:
    """Clear the read-only flag OmegaConf copies from our frozen dataclasses (recursively),
    so later sources can be merged in; the built dataclasses are frozen again."""
    if isinstance(node, DictConfig | ListConfig):
        OmegaConf.set_readonly(node, None)
        keys: list[Any] = list(node.keys() if isinstance(node, DictConfig) else range(len(node)))
        for key in keys:
            if not OmegaConf.is_missing(node, key) and not OmegaConf.is_interpolation(node, key):
                _unfreeze(node[key])


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


def yaml_shorthands(section: type | None, data: Any) -> Any:
    """``data`` (a mapping or an OmegaConf tree) for dataclass ``section`` with two YAML
    shorthands made explicit, where the field's declared type asks for it:

    * the booleans that YAML 1.1 made of ``off`` / ``on`` / ``yes`` / ``no`` turned back into
      the word, for a ``Literal`` offering that word (e.g. ``Literal["off", "tis", "mis"]``);
    * a single string for a list field made a one-item list (verl's
      ``train_files: data/train.parquet``); an ``${...}`` interpolation is left to resolve.
    """
    if isinstance(data, DictConfig):
        data = OmegaConf.to_container(data, resolve=False)
    if section is None or not isinstance(data, dict):
        return data
    hints = typing.get_type_hints(section)
    fixed = {}
    for key, value in data.items():
        hint = hints.get(key)
        if isinstance(value, bool):
            literals = [o for o in _options(hint) if typing.get_origin(o) is typing.Literal]
            choices = [choice for o in literals for choice in typing.get_args(o)]
            value = next((w for w in _YAML_BOOL_WORDS[value] if w in choices), value)
        elif isinstance(value, str):
            value = _as_list(value, hint)
        elif isinstance(value, dict):
            value = yaml_shorthands(_section(hint), value)
        fixed[key] = value
    return fixed


def load_mapping(
    path: str | PathLike[str] | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """A YAML file plus overrides as a plain, resolved dict (no schema).

    For files that hold several configs (a recipe's stages); each part is then built with
    :func:`load_config` (``base=...``), which checks it against its schema. The overrides'
    grammar is :func:`compose_config`'s, except that with no schema every key is free:
    ``key.sub=value`` sets a key or adds it (a misspelt key is refused when its part is
    built), ``~key`` removes one, and ``key={k: v}`` replaces a mapping.
    """
    tree: DictConfig = OmegaConf.create({}) if path is None else _read_yaml(path)
    for override in parse_overrides(overrides):
        if override.action == "set":  # no schema: setting a key may add it
            override = dataclasses.replace(override, action="force")
        try:
            apply_override(tree, override, replace=True)
        except OmegaConfBaseException as error:
            _raise(error, f"{COMMAND_LINE}: {override.text}")
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
        self.tree = merge_config(self.tree, yaml_shorthands(self.cls, data), source)

    def apply(self, override: Override) -> None:
        """Apply one parsed override: verl keys translated, the schema's rules on top of the
        grammar's (``~`` back to the default, ``{...}`` replacing a free mapping)."""
        try:
            if override.key.split(".")[0] == VARS_KEY:  # user variables: vars.name=... adds
                force = "force" if override.action == "set" else override.action
                apply_override(self.tree, dataclasses.replace(override, action=force))
            elif override.action == "drop":
                for ours in translate_drop(override.key, self.cls.__name__):
                    self._drop(dataclasses.replace(override, key=ours))
            else:
                for ours, value in translate_value(
                    override.key, override.value, self.aliases, COMMAND_LINE
                ):
                    # verl's `+key` adds to verl's config and a translated key may land in a
                    # free mapping: set ours, or add it (checked: only inside free mappings)
                    action = override.action if ours == override.key else "force"
                    self._set(dataclasses.replace(override, key=ours, value=value, action=action))
        except OmegaConfBaseException as error:
            _raise(error, f"{COMMAND_LINE}: {override.text}")

    def _set(self, override: Override) -> None:
        """Set (``=``), add (``+``) or force (``++``) one of our keys."""
        if override.action != "set":
            self._check_addable(override.key, override.text)
        else:
            self._check_known(override.key, override.text)
        _, hint = _schema_field(self.cls, override.key)
        self._fill_sections(override.key)
        value = _as_list(override.value, hint)
        replace = override.action == "set" and _is_hint(hint, dict)
        apply_override(self.tree, dataclasses.replace(override, value=value), replace=replace)

    def _fill_sections(self, key: str) -> None:
        """Give a required (``???``) or ``None`` section on the way to ``key`` its defaults, as
        a section of a YAML file would: OmegaConf sets no key below one."""
        node: Any = self.tree
        section: type | None = self.cls
        for part in key.split(".")[:-1]:
            if part not in _field_names(section) or OmegaConf.is_interpolation(node, part):
                return
            hint = typing.get_type_hints(section)[part]
            section = _section(hint)
            if OmegaConf.is_missing(node, part) or node[part] is None:
                if section is None and not _is_hint(hint, dict):
                    return
                node[part] = {} if section is None else OmegaConf.structured(section)
                _unfreeze(node)
            node = node[part]

    def _check_known(self, key: str, text: str) -> None:
        """A key of no section of the schema (a misspelling, or a verl key we do not
        translate) refused in one line naming it, before OmegaConf's own error."""
        section: type | None = self.cls
        parts = key.split(".")
        for index, part in enumerate(parts):
            fields = _field_names(section)
            if part not in fields:
                close = difflib.get_close_matches(part, fields, n=1)
                hint = f". Did you mean: {close[0]!r}?" if close else ""
                owner = section.__name__ if section is not None else self.cls.__name__
                raise ConfigurationError(
                    f"{'.'.join(parts[: index + 1])}: Key {part!r} not in {owner!r}{hint} (from "
                    f"{COMMAND_LINE}: {text}); drop it or fix its spelling (docs/from-verl.md "
                    "lists the verl keys that are translated, docs/configuration.md our keys)"
                )
            section = _section(typing.get_type_hints(section).get(part))
            if section is None:  # a value or a free mapping: its own type checks apply
                return

    def _check_addable(self, key: str, text: str) -> None:
        """``+key`` / ``++key`` add keys only inside free mappings: a misspelt key added to a
        section of the schema would be silently ignored."""
        section, _ = _schema_field(self.cls, key)
        fields = _field_names(section)
        leaf = key.rpartition(".")[2]
        if section is not None and leaf not in fields:
            close = difflib.get_close_matches(leaf, fields, n=1)
            prefix = key.rpartition(".")[0]
            hint = f" (did you mean {prefix + '.' if prefix else ''}{close[0]}?)" if close else ""
            raise ConfigurationError(
                f"override {text!r}: {key} is not a key of {section.__name__}{hint}, and +key "
                "adds keys only inside free mappings "
                "(rollout.engine_kwargs, model.hf_config, vars); `hybridflow <command> --help` "
                "lists the sections, docs/configuration.md every key"
            )

    def _drop(self, override: Override) -> None:
        """``~key``: a key of the schema goes back to its default (OmegaConf cannot delete a
        dataclass field); a key of a free mapping is removed."""
        section, _ = _schema_field(self.cls, override.key)
        leaf = override.key.rpartition(".")[2]
        if section is None or leaf not in _field_names(section):
            apply_override(self.tree, override)
            return
        defaults = OmegaConf.structured(section)  # no field defaults to an interpolation
        default = "???" if OmegaConf.is_missing(defaults, leaf) else defaults[leaf]
        OmegaConf.update(self.tree, override.key, default, merge=False)
        _unfreeze(self.tree)

    def finish(self) -> DictConfig:
        """The merged tree with verl aliases that depend on several keys settled."""
        for key, value in self.aliases.derived(self.tree).items():
            self._merge(OmegaConf.from_dotlist([f"{key}={value}"]), "verl aliases")
        return self.tree


def compose_config(
    cls: type,
    path: str | PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    base: Mapping[str, Any] | None = None,
) -> DictConfig:
    """Merge ``base``, the YAML at ``path`` and ``overrides`` into the schema of ``cls``.

    Returns the typed (not yet resolved) OmegaConf tree, user ``vars`` included; later
    sources win key by key. Unknown keys and values of the wrong type are refused here. The
    verl keys given that have no effect here are named in one
    :class:`~hf_algos.config.aliases.VerlKeysNoEffect` warning (the CLI prints it as a note).
    """
    tree, tracker = compose_tracked(cls, path, overrides, base)
    if tracker.ignored:  # one line for all of them, pointing at the caller
        warnings.warn(no_effect_message(tracker.ignored), VerlKeysNoEffect, stacklevel=2)
    return tree


def compose_tracked(
    cls: type,
    path: str | PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    base: Mapping[str, Any] | None = None,
) -> tuple[DictConfig, AliasTracker]:
    """:func:`compose_config`'s tree, and its :class:`AliasTracker`: which of our keys each
    source set (``set_by``), and the verl values that keys of ours are computed from
    (:mod:`hf_algos.config.convert_verl` writes those keys, not the defaults)."""
    composer = _Composer(cls)
    if base:
        composer.merge_mapping(base, "base config")
    if path is not None:
        tree = OmegaConf.to_container(_read_yaml(path), resolve=False)
        assert isinstance(tree, dict)
        composer.merge_mapping({str(k): v for k, v in tree.items()}, str(path))
    with open_dict(composer.tree):
        composer.tree[VARS_KEY] = composer.variables
    for override in parse_overrides(overrides, COMMA_LIST_KEYS):
        composer.apply(override)
    return composer.finish(), composer.aliases


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
    if OmegaConf.is_missing(node, name):
        raise ConfigurationError(
            f"missing required key {path}; set it in the YAML file or with "
            f"{path}.<key>=... on the command line"
        )
    child = node[name]
    kind = OmegaConf.get_type(child) if isinstance(child, DictConfig) else None
    if isinstance(child, DictConfig) and isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _build(kind, child, path)
    value = OmegaConf.to_object(child) if isinstance(child, DictConfig | ListConfig) else child
    if isinstance(value, list) and _is_hint(hint, tuple):
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
