"""A verl config rewritten as a native one, translated once: ``hybridflow convert-verl``.

The verl YAML and its ``key=value`` overrides are composed exactly as a load composes them
(:func:`hf_algos.config.loading.compose_tracked`, through the table of
:mod:`hf_algos.config.aliases`), so a verl key we refuse is the same error, naming the key
and the fix. Of the composed tree only the keys the user set are kept, under our names and
leaf by leaf (the tracker's ``set_by``), plus the values verl splits over several keys
(``trainer.n_workers`` from ``n_gpus_per_node`` x ``nnodes``); the defaults are left out.
What did not carry over (ignored verl keys, keys one of ours covers, derived values) comes
back as notes for the user.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hf_algos.config.aliases import AliasTracker, find_alias, no_effect_message
from hf_algos.config.loading import VARS_KEY, compose_tracked

_ABSENT = object()
"""A key the composed tree no longer holds (dropped from a free mapping by ``~key``)."""

_MINI_BATCH = "actor_rollout_ref.actor.ppo_mini_batch_size"
_GPUS_PER_NODE = "trainer.n_gpus_per_node"


@dataclass(frozen=True)
class VerlConversion:
    """A verl config in our key paths, and what the user should know about the change."""

    native: dict[str, Any]
    """The keys the user set, nested under our names (values unresolved: ``${...}`` kept)."""
    notes: tuple[str, ...]
    """One line per verl key that was ignored, covered by another key or computed."""

    def to_yaml(self, source: str) -> str:
        """The native config as a YAML file's text, with a header naming ``source``."""
        header = (
            f"# converted from the verl config {source} by `hybridflow convert-verl`\n"
            "# (verl's keys translated once; docs/from-verl.md)\n"
        )
        return header + OmegaConf.to_yaml(OmegaConf.create(self.native))


def convert_verl(
    cls: type, path: str | PathLike[str], overrides: Sequence[str] = ()
) -> VerlConversion:
    """The verl YAML at ``path`` plus ``overrides`` (verl's or our key paths) as a config of
    root class ``cls`` (``RLConfig``): composed and checked as a load does (unknown keys,
    types, refused verl keys are a :class:`ConfigurationError`), torch-free."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tree, tracker = compose_tracked(cls, path, overrides)
        derived = tracker.derived(tree)
    plain = OmegaConf.to_container(tree, resolve=False)
    assert isinstance(plain, dict)
    native: dict[str, Any] = {}
    for key in [*_given_leaves(tracker), *derived]:
        value = _get(plain, key)
        if value is not _ABSENT:
            _put(native, key, value)
    if plain.get(VARS_KEY):
        native[VARS_KEY] = plain[VARS_KEY]
    notes = [no_effect_message([ignored]) for ignored in tracker.ignored]  # one line per key
    for other in caught:  # not ours: as they were
        warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    notes += _shared_notes(tracker) + _derived_notes(tracker, tree, derived)
    return VerlConversion(native, tuple(notes))


def _given_leaves(tracker: AliasTracker) -> Iterator[str]:
    """Our dotted keys the sources set: a mapping given for a section stands for its leaves
    (not the whole section with its defaults)."""
    for ours, (_, value, _) in tracker.set_by.items():
        if isinstance(value, Mapping) and value:
            yield from (f"{ours}.{leaf}" for leaf in _leaves(value))
        else:
            yield ours


def _leaves(data: Mapping[Any, Any]) -> Iterator[str]:
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            yield from (f"{key}.{leaf}" for leaf in _leaves(value))
        else:
            yield str(key)


def _get(tree: Mapping[Any, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _put(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def _shared_notes(tracker: AliasTracker) -> list[str]:
    """verl's per-role keys that one key of ours covers (checked equal by the load)."""
    return [
        f"{given}={value!r} is not written: {ours} covers it (the reference runs in the "
        "actor's engine layout)"
        for given, value, ours, _ in tracker.shared
    ]


def _derived_notes(tracker: AliasTracker, tree: DictConfig, derived: dict[str, Any]) -> list[str]:
    """The values computed from verl keys, with the keys they depend on."""
    notes = []
    config = tracker.config.__name__
    if tracker.gpus_per_node is not None:
        alias = find_alias(_GPUS_PER_NODE, config)
        keys = ("trainer.n_workers", "trainer.use_gpu")
        written = ", ".join(f"{k}={derived[k]!r}" for k in keys if k in derived)
        note = alias.note if alias is not None else ""
        notes.append(
            f"{_GPUS_PER_NODE}={tracker.gpus_per_node} (with trainer.nnodes="
            f"{tree.trainer.nnodes}) is written as {written}: {note}"
        )
    if tracker.mini_batch_prompts is not None:
        alias = find_alias(_MINI_BATCH, config)
        note = alias.note if alias is not None else ""
        rows = derived["actor.ppo_mini_batch_size"]
        notes.append(
            f"{_MINI_BATCH}={tracker.mini_batch_prompts[0]} (prompts) is written as "
            f"actor.ppo_mini_batch_size={rows} (rows, with rollout.n={tree.rollout.n}): {note}; "
            "set it again if you change rollout.n"
        )
    return notes
