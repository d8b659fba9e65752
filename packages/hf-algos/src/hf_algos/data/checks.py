"""Checks of dataset rows, run while a dataset is built so bad data fails before training.

Each check raises :class:`~hf_algos.data.files.DataError` naming the file, the row and the
field, and how to fix it. The RL, SFT and preference datasets share them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hf_algos.data.files import DataError, RowSource
from hf_protocol import fields

GROUND_TRUTH_TYPES = (str, int, float)
"""A ground truth is one of these, or a non-empty list of them (several accepted answers)."""


def require_field(
    source: RowSource, row: Mapping[str, Any], key: str, fix: str, name: str | None = None
) -> Any:
    """``row[key]``, or a :class:`DataError` naming field ``name`` (default ``key``) when the
    row lacks it or it is null."""
    if row.get(key) is None:
        problem = "is null" if key in row else f"is missing (the row has {sorted(row)})"
        raise DataError(source, name or key, problem, fix)
    return row[key]


def check_prompt(source: RowSource, key: str, prompt: Any) -> None:
    """A prompt is a non-empty string, or a non-empty list of ``{"role", "content"}`` messages
    whose roles and contents are strings (at least one content non-empty)."""
    fix = (
        f"give {key!r} as a non-empty string or a list of "
        '{"role": "user", "content": "..."} messages (or set data.prompt_key to the prompt column)'
    )
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(source, key, "is an empty string", fix)
        return
    if not isinstance(prompt, list):
        raise DataError(source, key, f"has type {type(prompt).__name__} ({prompt!r:.60})", fix)
    if not prompt:
        raise DataError(source, key, "is an empty message list", fix)
    for index, message in enumerate(prompt):
        if not isinstance(message, Mapping) or not all(
            isinstance(message.get(part), str) for part in ("role", "content")
        ):
            raise DataError(
                source,
                f"{key}[{index}]",
                f"is {message!r:.80}, not a message with string 'role' and 'content'",
                fix,
            )
    if not any(message["content"].strip() for message in prompt):
        raise DataError(source, key, "has only empty message contents", fix)


def check_text(source: RowSource, key: str, row: Mapping[str, Any], fix: str) -> str:
    """``row[key]`` as a non-empty string (an SFT target, a DPO chosen / rejected response)."""
    text = require_field(source, row, key, fix)
    if not isinstance(text, str):
        raise DataError(
            source, key, f"has type {type(text).__name__} ({text!r:.60}), not text", fix
        )
    if not text.strip():
        raise DataError(source, key, "is an empty string", fix)
    return text


def check_reward_fields(source: RowSource, row: Mapping[str, Any], required: bool = True) -> None:
    """The fields rule-based scoring reads: ``data_source`` (which scoring function) and
    ``reward_model.ground_truth``; ``extra_info``, when given, must be a dict.

    ``required=False`` (one reward function for every row, ``reward.function_path``, or a
    reward model): each field is checked only where the row gives it (TRL's prompt-only rows).
    """
    source_fix = "give every row a 'data_source' string naming its reward function"
    if required or row.get(fields.DATA_SOURCE) is not None:
        data_source = require_field(source, row, fields.DATA_SOURCE, source_fix)
        if not isinstance(data_source, str) or not data_source:
            raise DataError(source, fields.DATA_SOURCE, f"is {data_source!r:.60}", source_fix)
    if not required and row.get(fields.REWARD_MODEL) is None:
        _check_extra_info(source, row)
        return
    truth_fix = (
        "give 'reward_model' as {\"ground_truth\": ...} with a string or number (or a list of "
        "them) as the ground truth"
    )
    reward_model = require_field(source, row, fields.REWARD_MODEL, truth_fix)
    if not isinstance(reward_model, Mapping):
        problem = f"has type {type(reward_model).__name__} ({reward_model!r:.60}), not dict"
        raise DataError(source, fields.REWARD_MODEL, problem, truth_fix)
    truth_key = f"{fields.REWARD_MODEL}.ground_truth"
    truth = require_field(source, reward_model, "ground_truth", truth_fix, truth_key)
    if not _is_ground_truth(truth):
        problem = f"has type {type(truth).__name__} ({truth!r:.60})"
        raise DataError(source, truth_key, problem, truth_fix)
    _check_extra_info(source, row)


def _check_extra_info(source: RowSource, row: Mapping[str, Any]) -> None:
    extra = row.get(fields.EXTRA_INFO)
    if extra is not None and not isinstance(extra, Mapping):
        raise DataError(
            source,
            fields.EXTRA_INFO,
            f"has type {type(extra).__name__} ({extra!r:.60})",
            "give 'extra_info' as a dict (or leave it out)",
        )


def _is_ground_truth(value: Any) -> bool:
    def scalar(item: Any) -> bool:
        # bool is an int subclass, but True as an answer is almost always a broken column
        return isinstance(item, GROUND_TRUTH_TYPES) and not isinstance(item, bool)

    if isinstance(value, list):
        return bool(value) and all(scalar(item) for item in value)
    return scalar(value)
