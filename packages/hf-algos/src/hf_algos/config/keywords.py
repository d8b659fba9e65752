"""A config section's fields as a consumer's keyword arguments, under their own names.

A section's field is named as the keyword of the function or class it feeds (the policy
loss's ``clip_low``, the estimator's ``norm_adv_by_std``): the trainer passes the fields a
consumer takes by name, with no renaming layer between the YAML key and the consumer
(verl's spellings are entries of :mod:`hf_algos.config.aliases`, applied at load).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar


def keyword_names(consumer: Callable[..., Any]) -> tuple[str, ...]:
    """The parameters of ``consumer`` (a function or a class) that can be passed by name."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(consumer).parameters.values()
    return tuple(p.name for p in parameters if p.kind in kinds)


def section_kwargs(section: Any, names: Iterable[str]) -> dict[str, Any]:
    """The fields of the dataclass ``section`` whose names are in ``names`` (a consumer's
    keywords, :func:`keyword_names`), by name: ``{field: value}``."""
    fields = {f.name for f in dataclasses.fields(section)}
    return {name: getattr(section, name) for name in names if name in fields}


_T = TypeVar("_T")


def build_from(consumer: Callable[..., _T], section: Any, **overrides: Any) -> _T:
    """``consumer`` (a worker's config class) called with the fields of ``section`` it takes,
    by name, and with ``overrides``: the values the trainer sets itself (the device, the
    seed, the run's length) in place of, or besides, the section's."""
    return consumer(**{**section_kwargs(section, keyword_names(consumer)), **overrides})
