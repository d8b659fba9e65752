"""RL rows generated from a reasoning-gym task, in verl's row schema.

A spec string such as
``reasoning_gym:chain_sum?size=2000&seed=0&answer=last_number&min_terms=2&max_digits=1``
stands wherever a data file is accepted (``data.train_files``, :class:`RLDataset`): its rows
are ``reasoning_gym.create_dataset(task, size=..., seed=..., **kwargs)``'s entries, with
``data_source="reasoning_gym"`` so that :func:`hf_algos.rewards.reasoning_gym.
compute_reasoning_gym_score` scores them with the task's own verifier. ``reasoning_gym`` is
imported only when a spec is used (it takes seconds).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl

ANSWER_FORMATS = ("last_number", "last_line", "answer_tag", "answer_prefix")
"""How an answer is taken out of a response; see :func:`extract_answer`."""

REASONING_GYM_DATA_SOURCE = "reasoning_gym"
"""The ``data_source`` of every reasoning-gym row."""

SPEC_PREFIX = "reasoning_gym:"
"""What a spec string starts with."""

INSTRUCTIONS: Mapping[str, str] = {
    "last_number": "",
    "last_line": "Give your final answer alone on the last line.",
    "answer_tag": "Put your final answer inside <answer></answer> tags.",
    "answer_prefix": "End your response with a line 'Answer: <your final answer>'.",
}
"""The instruction appended to each question, per answer format (none for ``last_number``:
a plain chat model's answer ends with its number anyway)."""

_EXAMPLE = "reasoning_gym:chain_sum?size=2000&seed=0&answer=last_number&min_terms=2"


@dataclass(frozen=True)
class ReasoningGymSpec:
    """A reasoning-gym task and how many of its entries to generate."""

    task: str
    """The reasoning-gym task name (``chain_sum``, ``basic_arithmetic``, ...)."""
    size: int = 1000
    """Rows generated."""
    seed: int = 0
    """Seed of the generator: the same spec gives the same rows."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """The task's own settings (the fields of its config dataclass, e.g. ``min_terms``)."""
    answer: str = "last_number"
    """Where the answer is in a response (and what the prompt asks for): one of
    :data:`ANSWER_FORMATS`."""

    def __post_init__(self) -> None:
        if self.answer not in ANSWER_FORMATS:
            raise ValueError(f"answer={self.answer!r} is not one of {ANSWER_FORMATS}")
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")


def is_reasoning_gym_spec(path: object) -> bool:
    """Whether ``path`` is a spec string (``reasoning_gym:<task>?...``) rather than a file."""
    return isinstance(path, str) and path.startswith(SPEC_PREFIX)


def parse_reasoning_gym_spec(text: str) -> ReasoningGymSpec:
    """The spec of ``reasoning_gym:<task>?size=..&seed=..&answer=..&<task setting>=..``.

    Values read as int, float, ``true`` / ``false``, else text; keys other than ``size``,
    ``seed`` and ``answer`` are the task's settings. A malformed spec raises ``ValueError``
    with an example; the task and its settings are checked by
    :func:`check_reasoning_gym_spec`.
    """
    if not is_reasoning_gym_spec(text):
        raise ValueError(f"{text!r} is not a reasoning-gym spec; write it as {_EXAMPLE!r}")
    task, _, query = text[len(SPEC_PREFIX) :].partition("?")
    if not task:
        raise ValueError(f"{text!r} names no task; write it as {_EXAMPLE!r}")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as error:
        raise ValueError(f"{text!r}: {error}; write it as {_EXAMPLE!r}") from error
    values: dict[str, Any] = {}
    for key, raw in pairs:
        if key in values:
            raise ValueError(f"{text!r} gives {key!r} twice; give it once")
        values[key] = _value(raw)
    size, seed = values.pop("size", 1000), values.pop("seed", 0)
    answer = values.pop("answer", "last_number")
    for name, value in (("size", size), ("seed", seed)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{text!r}: {name}={value!r} must be an integer")
    try:
        return ReasoningGymSpec(task, size, seed, values, str(answer))
    except ValueError as error:
        raise ValueError(f"{text!r}: {error}") from error


def _value(raw: str) -> Any:
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(raw.lower(), raw)


def _dataset(spec: ReasoningGymSpec) -> Any:
    """``reasoning_gym.create_dataset`` of ``spec``; an unknown task or a setting the task
    refuses raises ``ValueError`` saying how to fix it."""
    reasoning_gym = import_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    if spec.task not in DATASETS:
        close = difflib.get_close_matches(spec.task, list(DATASETS), n=5, cutoff=0.5)
        hint = f"did you mean one of {close}?" if close else f"known tasks: {sorted(DATASETS)}"
        raise ValueError(f"reasoning-gym has no task {spec.task!r}; {hint}")
    try:
        return reasoning_gym.create_dataset(
            spec.task, size=spec.size, seed=spec.seed, **spec.kwargs
        )
    except (TypeError, ValueError, AssertionError) as error:
        config_cls = DATASETS[spec.task][1]
        settings = [
            f.name for f in dataclasses.fields(config_cls) if f.name not in ("size", "seed")
        ]
        raise ValueError(
            f"reasoning-gym task {spec.task!r} refuses the settings {dict(spec.kwargs)} "
            f"({type(error).__name__}: {error}); give settings among {settings} "
            f"({config_cls.__name__}) with values it accepts"
        ) from error


@functools.lru_cache(maxsize=64)
def check_reasoning_gym_spec(text: str) -> ReasoningGymSpec:
    """Parse ``text`` and build its dataset and first entry (fast: entries are generated on
    demand), so an unknown task or a bad setting fails before training; raises
    ``ValueError`` naming the problem and the fix. Cached per spec string."""
    spec = parse_reasoning_gym_spec(text)
    dataset = _dataset(spec)
    try:
        dataset[0]
    except Exception as error:
        raise ValueError(
            f"reasoning-gym task {spec.task!r} cannot generate an entry with the settings "
            f"{dict(spec.kwargs)} ({type(error).__name__}: {error}); change them"
        ) from error
    return spec


def reasoning_gym_rows(spec: ReasoningGymSpec | str) -> list[dict[str, Any]]:
    """The RL rows of ``spec`` (or of its spec string), in verl's row schema.

    Each row: ``data_source`` ``"reasoning_gym"``; ``prompt``, one user message (the question
    and the answer format's instruction, :data:`INSTRUCTIONS`); ``ability``, the task's
    category; ``reward_model`` ``{"style": "rule", "ground_truth": <the entry's answer>}``;
    ``extra_info`` with ``task``, ``index``, ``answer_format``, ``entry`` (the reasoning-gym
    entry as one JSON string, :func:`encode_entry`, so Arrow
    holds any task's metadata) and ``task_config`` (the
    task's settings as JSON, for its verifier).
    """
    if isinstance(spec, str):
        spec = parse_reasoning_gym_spec(spec)
    dataset = _dataset(spec)
    instruction = INSTRUCTIONS[spec.answer]
    config = json.dumps(dict(spec.kwargs), sort_keys=True)
    rows = []
    for index, entry in enumerate(dataset):
        question = str(entry["question"])
        content = f"{question}\n\n{instruction}" if instruction else question
        answer = entry.get("answer")
        rows.append(
            {
                "data_source": REASONING_GYM_DATA_SOURCE,
                "prompt": [{"role": "user", "content": content}],
                "ability": str(getattr(dataset, "category", "reasoning")),
                "reward_model": {
                    "style": "rule",
                    "ground_truth": "" if answer is None else str(answer),
                },
                "extra_info": {
                    "task": spec.task,
                    "index": index,
                    "answer_format": spec.answer,
                    "entry": encode_entry(entry),
                    "task_config": config,
                },
            }
        )
    return rows


def encode_entry(entry: Mapping[str, Any]) -> str:
    """A reasoning-gym entry as one JSON string that :func:`decode_entry` turns back into an
    equal entry: tuples, sets and dicts with non-text keys are tagged (``{"__tuple__": [...]}``),
    since verifiers compare them (``arc_agi``'s grids are tuples of tuples); other values JSON
    cannot hold become their ``repr``."""
    return json.dumps(_tagged(entry))


def decode_entry(text: str) -> Any:
    """The entry of :func:`encode_entry`'s ``text``."""
    return json.loads(text, object_hook=_untagged)


def _tagged(value: Any) -> Any:
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value):
            return {key: _tagged(item) for key, item in value.items()}
        return {"__dict__": [[_tagged(key), _tagged(item)] for key, item in value.items()]}
    if isinstance(value, list):
        return [_tagged(item) for item in value]
    if isinstance(value, tuple):
        return {"__tuple__": [_tagged(item) for item in value]}
    if isinstance(value, (set, frozenset)):
        return {"__set__": [_tagged(item) for item in sorted(value, key=repr)]}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "tolist"):  # a numpy array or scalar
        return _tagged(value.tolist())
    return repr(value)


def _untagged(value: dict[str, Any]) -> Any:
    if len(value) == 1:
        (key, items), *_ = value.items()
        if key == "__tuple__":
            return tuple(items)
        if key == "__set__":
            return set(items)
        if key == "__dict__":
            return {_hashable(k): item for k, item in items}
    return value


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def import_reasoning_gym() -> ModuleType:
    """``reasoning_gym`` (seconds to import), or an ``ImportError`` saying how to install it."""
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError(
            f"reasoning-gym tasks need the reasoning_gym package ({error}); install it with "
            f"pip install 'hf-algos[tasks]'"
        ) from error
    return reasoning_gym
