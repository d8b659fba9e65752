"""Environments a multi-turn rollout talks to: the protocol, the step result, the registry.

An environment runs one episode at a time: ``reset`` gets the prompt and the row's extra
fields, each ``step`` gets the text of one model turn and answers with a :class:`StepResult`
(the observation appended as environment tokens, a reward, whether the episode is done).
Environments are named in config (``rollout.multi_turn.environment``) by a registered name
or by ``path/to/file.py:Class`` / ``package.module:Class``; :func:`environment_factory`
turns either into a zero-argument factory, one environment per episode.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = [
    "ENVIRONMENTS",
    "Environment",
    "EnvironmentSpecError",
    "StepResult",
    "environment_factory",
    "register_environment",
]


@dataclass(frozen=True)
class StepResult:
    """What an environment answers to one model turn."""

    observation: str = ""
    """Text appended to the conversation as environment tokens (``response_mask`` 0);
    ``""`` appends nothing."""
    reward: float = 0.0
    """Reward for this turn; an episode's rewards are summed into ``env_reward``."""
    done: bool = False
    """The episode ends after this turn; a done turn's observation is not appended."""
    tool_calls: int = 0
    """Tool calls the model made in this turn (well-formed or not), for the tool-call rate."""


@runtime_checkable
class Environment(Protocol):
    """A tool or environment the model talks to, one episode at a time."""

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        """Start an episode for ``prompt`` (its text); ``info`` holds the row's
        ``data_source``, ``ground_truth`` and ``extra_info`` where the data has them."""
        ...

    def step(self, model_text: str) -> StepResult:
        """The answer to one model turn (the decoded text the model generated)."""
        ...


class EnvironmentSpecError(ValueError):
    """An environment spec that names nothing loadable, or a class that is no environment."""


E = TypeVar("E", bound=type)

ENVIRONMENTS: dict[str, type] = {}
"""Registered environment classes by name (``rollout.multi_turn.environment``)."""


def register_environment(name: str) -> Callable[[E], E]:
    """Class decorator registering an :class:`Environment` class under ``name``."""

    def decorate(cls: E) -> E:
        if name in ENVIRONMENTS and ENVIRONMENTS[name] is not cls:
            raise EnvironmentSpecError(
                f"environment {name!r} is already registered as {ENVIRONMENTS[name].__qualname__}; "
                "pick another name"
            )
        ENVIRONMENTS[name] = cls
        return cls

    return decorate


def environment_factory(spec: str, **kwargs: Any) -> Callable[[], Environment]:
    """A factory of fresh environments for ``spec``, each built as ``cls(**kwargs)``.

    ``spec`` is a registered name, ``path/to/file.py:Class`` or ``package.module:Class``.
    The class is loaded and one instance is built and checked now, so a bad spec or bad
    arguments fail here (at set-up), not in the first episode.
    """
    cls = _load_class(spec)
    try:
        probe = cls(**kwargs)
    except TypeError as error:
        raise EnvironmentSpecError(
            f"environment {spec!r} cannot be built with arguments {sorted(kwargs)}: {error}"
        ) from error
    if not isinstance(probe, Environment):
        raise EnvironmentSpecError(
            f"environment {spec!r} ({cls.__qualname__}) is not an Environment: it needs "
            "reset(prompt, info) and step(model_text) -> StepResult"
        )

    def make() -> Environment:
        environment: Environment = cls(**kwargs)
        return environment

    make.__name__ = make.__qualname__ = cls.__name__  # what an episode's error names
    return make


def _load_class(spec: str) -> type:
    if spec in ENVIRONMENTS:
        return ENVIRONMENTS[spec]
    if ":" not in spec:
        raise EnvironmentSpecError(
            f"unknown environment {spec!r}: registered ones are {sorted(ENVIRONMENTS)}; a "
            "custom one is named 'path/to/file.py:Class' or 'package.module:Class'"
        )
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where).expanduser()
        if not path.is_file():
            raise EnvironmentSpecError(
                f"environment file {str(path)!r} (from {spec!r}) does not exist"
            )
        module_name = f"_hf_environment_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as error:
            del sys.modules[module_name]
            raise EnvironmentSpecError(
                f"environment file {str(path)!r} (from {spec!r}) failed to load: "
                f"{type(error).__name__}: {error}"
            ) from error
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as error:
            raise EnvironmentSpecError(
                f"environment {spec!r}: cannot import {where!r}: {error}"
            ) from error
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise EnvironmentSpecError(f"environment {spec!r}: {where!r} has no class {name!r}")
    return cls
