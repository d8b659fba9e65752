"""Config files on OmegaConf: YAML plus ``key=value`` overrides, typed by our dataclasses.

A trainer's configuration is a tree of small frozen dataclasses (see
:mod:`hf_algos.config`, one module per section). :func:`compose_config` turns the dataclass into an
OmegaConf structured config and merges, in order, a ``base`` mapping, the YAML file and the
command-line overrides into it; OmegaConf converts every value to the type its field
declares (``lr: 1e-5`` becomes a float) and rejects unknown keys with a "did you mean".
:func:`instantiate_config` resolves ``${...}`` interpolations and builds the frozen
dataclasses, whose ``__post_init__`` checks run before any worker starts.

Command-line overrides are Hydra's: :func:`hydra.compose` applies them, in order, to the tree
merged so far (kept in Hydra's ``ConfigStore`` only while it composes; no global Hydra state,
working directory, output directory or log file is left behind), so the grammar and its
errors are Hydra's (``key=[a,b]``, ``key={k: v}``, ``key='a b'``, ``key=null``):

* ``key.sub=value`` sets a key of the schema (a bare value for a list key is a one-item list,
  ``data.train_files=a.parquet``; an empty one, ``data.val_files=``, the empty list);
* ``+key.sub=value`` adds a key that is not there yet, and ``++key.sub=value`` sets a key or
  adds it; both add keys only inside free mappings (``rollout.engine_kwargs``,
  ``actor.engine.model.hf_config``, ``vars``): a misspelt key of the schema is refused with
  a "did you mean", where Hydra would add it;
* ``~key.sub`` drops a key: a key of the schema goes back to its default, a key of a free
  mapping is removed;
* ``free.mapping={k: v}`` replaces a free mapping (``rollout.engine_kwargs={}`` empties it),
  where Hydra would merge into it; ``vars.name=value`` sets a variable or adds it.

YAML 1.1 reads an unquoted ``off`` / ``on`` / ``yes`` / ``no`` in a file as a boolean; where a
field's choices (a ``Literal``) hold such a word, ``mode: off`` means the word, not ``False``
(Hydra's grammar reads ``mode=off`` as the word already).

User variables live in the top-level ``vars:`` mapping (free keys, dropped before the
dataclasses are built), e.g. ``vars: {model: /models/qwen}`` and ``actor.engine.model.path:
${vars.model}``; every other key stays checked against the schema. verl's key paths are
translated by :mod:`hf_algos.config.aliases` in YAML files and overrides alike.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

from hydra import compose, initialize
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override, OverrideType
from hydra.errors import HydraException
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from omegaconf import DictConfig, ListConfig, OmegaConf, TupleConfig, open_dict
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException
from omegaconf.nodes import LiteralNode

from hf_algos.config.aliases import AliasTracker, translate_drop, translate_tree, translate_value
from hf_controller import ConfigurationError

ConfigT = TypeVar("ConfigT")

VARS_KEY = "vars"
"""Top-level mapping of user variables for ``${vars.name}`` interpolations."""

COMMAND_LINE = "the command line"
"""The source named in errors about overrides."""


_STORED_NAME = "_hybridflow_overrides_base"
"""The name the tree is given in Hydra's ConfigStore while Hydra composes overrides onto it
(removed again right after)."""


def _fix(error: OmegaConfBaseException, key: str) -> str:
    """What to do about an OmegaConf error at ``key``."""
    if isinstance(error, MissingMandatoryValue):
        return f"set {key}=... (or give the section in the YAML file)"
    if "not in" in str(error).split("\n")[0]:
        return (
            "check the spelling (`hybridflow <command> --help` lists the sections, "
            "docs/configuration.md every key); use +key=value only inside free mappings"
        )
    return "give a value of the type docs/configuration.md lists for this key"


def _raise(error: OmegaConfBaseException, source: str) -> typing.NoReturn:
    """Re-raise an OmegaConf error as a :class:`ConfigurationError` naming key and fix."""
    message = str(error).split("\n")[0]
    key = getattr(error, "full_key", None) or ""
    where = f" (from {source})" if source else ""
    raise ConfigurationError(f"{key}: {message}{where}; {_fix(error, key)}") from None


def _raise_hydra(error: HydraException) -> typing.NoReturn:
    """Re-raise Hydra's error as a :class:`ConfigurationError`: Hydra's own message (which
    names the override), with OmegaConf's reason, key and our fix where there is one."""
    cause = error.__cause__
    lines = [line.strip() for line in str(error).strip().split("\n") if line.strip()]
    if not isinstance(cause, OmegaConfBaseException):
        raise ConfigurationError("\n".join(lines)) from None
    if dataclasses.is_dataclass(getattr(cause, "object_type", None)):
        lines = lines[:1]  # not Hydra's "use +key": +key does not add keys to the schema
    key = getattr(cause, "full_key", None) or ""
    reason = str(cause).split("\n")[0]
    raise ConfigurationError(f"{key}: {reason} ({' '.join(lines)}); {_fix(cause, key)}") from None


COMMA_LIST_KEYS = ("data.train_files", "data.val_files")
"""List keys whose unbracketed ``a,b`` value is the list ``[a,b]`` (verl's scripts write the
data files so); elsewhere Hydra's reading stands: a sweep, refused."""


def _parse(overrides: Sequence[str]) -> list[Override]:
    """``overrides`` parsed by Hydra's override grammar; an error names the override."""
    parser = OverridesParser.create()
    parsed: list[Override] = []
    for text in map(str, overrides):
        try:
            parsed.extend(parser.parse_overrides([text]))
        except HydraException as error:
            detail = " ".join(line.strip() for line in str(error).strip().split("\n")[1:])
            raise ConfigurationError(
                f"override {text!r} does not parse (Hydra's override grammar): {detail} "
                "(quote a value with spaces or special characters: key='a b', "
                "data.train_files=['~/data/train.parquet'])"
            ) from None
        if not parsed[-1].key_or_group:  # Hydra's grammar allows "=3"; its compose does not
            raise ConfigurationError(f"override {text!r} names no key; write key.sub=value")
    return parsed


def _hydra_value(value: Any) -> str:
    """``value`` (a verl value converted to ours) written in Hydra's override grammar."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _is_scalar(value: Any) -> bool:
    """A single value (not a list, mapping, null or ``${...}`` interpolation)."""
    if isinstance(value, str):
        return not value.startswith("${")
    return isinstance(value, int | float)


def _options(hint: Any) -> tuple[Any, ...]:
    """The types a hint allows (``X | None`` -> ``X``, ``None``)."""
    origin = typing.get_origin(hint)
    return typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)


def _is_hint(hint: Any, *kinds: type) -> bool:
    """Whether type hint ``hint`` allows a value of one of ``kinds`` (``tuple[str, ...]``)."""
    return any(o in kinds or typing.get_origin(o) in kinds for o in _options(hint))


def _field_names(section: type | None) -> list[str]:
    return [f.name for f in dataclasses.fields(section)] if section is not None else []


def _schema_field(cls: type, key: str) -> tuple[type | None, Any]:
    """The section (dataclass) of schema ``cls`` that holds dotted ``key``, and the key's type
    hint; ``(None, None)`` below a free mapping. Read from the schema, not the tree, so an
    override is checked before the overrides ahead of it are composed."""
    *parents, leaf = key.split(".")
    section: Any = cls
    for part in parents:
        hint = typing.get_type_hints(section).get(part) if part in _field_names(section) else None
        section = next((o for o in _options(hint) if dataclasses.is_dataclass(o)), None)
        if section is None:
            return None, None
    hints = typing.get_type_hints(section)
    return section, hints.get(leaf)


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
    """A YAML file plus overrides as a plain, resolved dict (no schema).

    For files that hold several configs (a recipe's stages); each part is then built with
    :func:`load_config` (``base=...``), which checks it against its schema. The overrides are
    Hydra's, as in :func:`compose_config`, except that with no schema every key is free:
    ``key.sub=value`` sets a key or adds it (a misspelt key is refused when its part is
    built), ``~key`` removes one, and ``key={k: v}`` replaces a mapping.
    """
    tree: DictConfig = OmegaConf.create({}) if path is None else _read_yaml(path)
    pending: list[str] = []
    for override in _parse(overrides):
        key, line = override.key_or_group, override.input_line or ""
        if override.type == OverrideType.CHANGE and isinstance(override.value(), dict):
            tree = _hydra_compose(tree, pending)  # a mapping value replaces, not merges
            pending = []
            try:
                OmegaConf.update(tree, key, override.value(), merge=False)
            except OmegaConfBaseException as error:
                _raise(error, line)
        elif override.type == OverrideType.CHANGE and not override.is_sweep_override():
            pending.append(f"++{line}")  # no schema: setting a key may add it
        else:
            pending.append(line)
    tree = _hydra_compose(tree, pending)
    try:
        plain = OmegaConf.to_container(tree, resolve=True)
    except OmegaConfBaseException as error:
        _raise(error, str(path or ""))
    assert isinstance(plain, dict)
    return {str(k): v for k, v in plain.items()}


def _hydra_compose(tree: DictConfig, overrides: list[str]) -> DictConfig:
    """``tree`` with ``overrides`` applied by Hydra's compose API, in order; the tree is kept
    in Hydra's ``ConfigStore`` only while it composes (no global Hydra state, working
    directory, output directory or logging left changed)."""
    if not overrides:
        return tree
    store = ConfigStore.instance()
    store.store(name=_STORED_NAME, node=tree)
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize(config_path=None, job_name="hybridflow"):
            composed = compose(config_name=_STORED_NAME, overrides=overrides)
    except HydraException as error:
        _raise_hydra(error)
    finally:
        restore_gh_from_backup(backup)
        store.repo.pop(f"{_STORED_NAME}.yaml", None)
    OmegaConf.set_struct(composed, False)
    _unfreeze(composed)
    return composed


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

    def apply_overrides(self, overrides: Sequence[str]) -> None:
        """Apply command-line overrides in order: parsed by Hydra's grammar, verl keys
        translated, then composed by Hydra (``~`` on a key of the schema and ``{...}`` on a
        free mapping are ours: back to the default, and a replaced mapping)."""
        pending: list[str] = []
        for override in _parse(overrides):
            for step in self._translate(override):
                if isinstance(step, str):
                    pending.append(step)
                    continue
                self._compose(pending)  # ours comes after every override before it
                pending = []
                step()
        self._compose(pending)

    def _translate(self, override: Override) -> list[str | typing.Callable[[], None]]:
        """What one parsed override becomes: Hydra override strings, or our own steps."""
        key, line = override.key_or_group, override.input_line or ""
        listed = self._comma_list(override)
        if listed is not None:
            return self._translate(listed)
        if override.package is not None or override.is_sweep_override():
            return [line]  # Hydra explains what it does not compose
        if override.is_list_extend():  # Hydra's key=append(...) on a list
            return [line]
        if key.split(".")[0] == VARS_KEY:  # user variables: vars.name=... sets or adds
            return [f"++{line}" if override.type == OverrideType.CHANGE else line]
        if override.is_delete():
            dropped = translate_drop(key, self.cls.__name__)
            return [self._drop_step(ours, override) for ours in dropped]
        prefix = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++"}.get(override.type, "")
        steps: list[str | typing.Callable[[], None]] = []
        for ours, value, converted in translate_value(
            key, override.value(), self.aliases, COMMAND_LINE
        ):
            if prefix:
                self._check_addable(ours, line)
            text = _hydra_value(value) if converted else override.get_value_element_as_str()
            _, hint = _schema_field(self.cls, ours)
            if isinstance(value, dict) and not prefix and _is_hint(hint, dict):
                steps.append(functools.partial(self._replace, ours, value))
                continue
            one_string = isinstance(value, str) and _is_hint(hint, str)  # `str | tuple[str]`
            if _is_hint(hint, list, tuple) and _is_scalar(value) and not one_string:
                text = f"[{text}]" if text else "[]"  # a bare value for a list: one item
            self._fill_sections(ours)
            steps.append(f"{prefix}{ours}={text}")
        return steps

    def _comma_list(self, override: Override) -> Override | None:
        """``key=a,b`` (Hydra: a sweep, which we never run) on a key of
        :data:`COMMA_LIST_KEYS`, as verl users write ``data.train_files=a.parquet,b.parquet``:
        the override ``key=[a,b]``; else ``None``."""
        sweep = override.value()
        if not isinstance(sweep, ChoiceSweep) or not sweep.simple_form:
            return None
        line = override.input_line or ""
        if override.key_or_group not in COMMA_LIST_KEYS or "=" not in line:
            return None
        head, _, tail = line.partition("=")
        return _parse([f"{head}=[{tail}]"])[0]

    def _fill_sections(self, key: str) -> None:
        """Give a required (``???``) or ``None`` section on the way to ``key`` its defaults, as
        a section of a YAML file would: OmegaConf (and so Hydra) sets no key below one."""
        node: Any = self.tree
        section: Any = self.cls
        for part in key.split(".")[:-1]:
            if not isinstance(node, DictConfig) or part not in _field_names(section):
                return
            hint = typing.get_type_hints(section)[part]
            section = next((o for o in _options(hint) if dataclasses.is_dataclass(o)), None)
            child = node._get_node(part)
            empty = child is None or child._is_missing() or child._is_none()
            if empty and (section is not None or _is_hint(hint, dict)):
                node[part] = {} if section is None else OmegaConf.structured(section)
                _unfreeze(node)
            node = node._get_node(part)
            if section is None:
                return

    def _compose(self, overrides: list[str]) -> None:
        """The tree with ``overrides`` applied by Hydra's compose API."""
        self.tree = _hydra_compose(self.tree, overrides)

    def _replace(self, key: str, value: dict[str, Any]) -> None:
        """``key={...}`` on a free mapping replaces it (``rollout.engine_kwargs={}`` empties
        it), where Hydra would merge into its old keys."""
        self._fill_sections(key)
        try:
            OmegaConf.update(self.tree, key, value, merge=False)
        except OmegaConfBaseException as error:
            _raise(error, f"{key}={_hydra_value(value)}")

    def _check_addable(self, key: str, text: str) -> None:
        """``+key`` / ``++key`` add keys only inside free mappings: Hydra would add a
        misspelt key to a section of the schema, where it would be silently ignored."""
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

    def _drop_step(self, key: str, override: Override) -> str | typing.Callable[[], None]:
        """``~key``: a key of the schema goes back to its default (ours: OmegaConf cannot
        delete a dataclass field); anything else is Hydra's to delete."""
        section, _ = _schema_field(self.cls, key)
        leaf = key.rpartition(".")[2]
        if section is not None and leaf in _field_names(section):
            return functools.partial(self._reset, key, section, leaf)
        value = override.get_value_element_as_str() if override.value_type is not None else ""
        return f"~{key}={value}" if value else f"~{key}"

    def _reset(self, key: str, kind: type, leaf: str) -> None:
        default = OmegaConf.structured(kind)._get_node(leaf)
        OmegaConf.update(self.tree, key, default, merge=False)
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
    sources win key by key. Unknown keys and values of the wrong type are refused here.
    """
    composer = _Composer(cls)
    if base:
        composer.merge_mapping(base, "base config")
    if path is not None:
        tree = OmegaConf.to_container(_read_yaml(path), resolve=False)
        assert isinstance(tree, dict)
        composer.merge_mapping({str(k): v for k, v in tree.items()}, str(path))
    with open_dict(composer.tree):
        composer.tree[VARS_KEY] = composer.variables
    composer.apply_overrides(overrides)
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
    return _is_hint(hint, tuple)


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
