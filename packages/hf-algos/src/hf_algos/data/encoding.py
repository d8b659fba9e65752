"""Tokenizing dataset tables with ``datasets.Dataset.map`` (``num_proc`` workers, its cache).

A dataset kind (RL, SFT, preference) gives a :class:`RowEncoder`: per row it checks the
fields (raising :class:`~hf_algos.data.files.DataError`) and names the texts to tokenize;
the texts of a whole map batch are tokenized in one call of the fast tokenizer. A bad row
does not stop the map (an exception in a worker process loses its row): it is recorded, and
the first one in file order is raised afterwards with its file, row, field and fix.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from hf_algos.data.files import DataError, RowSource
from hf_algos.data.sources import TablePart

if TYPE_CHECKING:
    import datasets

ERROR_COLUMN = "__hf_row_error"
"""Map output column: ``""``, or the row's problem as JSON ``[field, problem, fix]``."""

UNLOCATED = RowSource(None, -1)
"""Source of a DataError raised by :meth:`RowEncoder.prepare` (the caller fills in the real
file and row)."""

_MAP_BATCH_SIZE = 512


class RowEncoder(Protocol):
    """What a dataset kind does per row (it must pickle: ``num_proc`` sends it to workers)."""

    tokenizer: Any
    """The tokenizer of :meth:`prepare`'s texts."""

    def prepare(self, row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[str, bool]]]:
        """Check ``row``; return new columns and ``{column: (text, add_special_tokens)}`` of
        the texts whose token ids go in those columns. Raises :class:`DataError` (its
        source is filled in by the caller)."""
        ...

    def finish(self, item: dict[str, Any]) -> dict[str, Any]:
        """The new columns of one row once its texts are token ids (e.g. an EOS appended)."""
        ...


def encode_rows(
    rows: Sequence[dict[str, Any]], encoder: RowEncoder
) -> tuple[list[dict[str, Any] | None], list[str]]:
    """New columns of each row (``None`` for a bad row) and each row's error (``""``: none)."""
    prepared: list[dict[str, Any] | None] = []
    errors: list[str] = []
    texts: dict[tuple[str, bool], list[tuple[int, str, str]]] = {}
    for index, row in enumerate(rows):
        try:
            item, wanted = encoder.prepare(row)
        except DataError as error:
            prepared.append(None)
            errors.append(json.dumps([error.field, error.problem, error.fix]))
            continue
        prepared.append(item)
        errors.append("")
        for column, (text, special) in wanted.items():
            texts.setdefault((column, special), []).append((index, column, text))
    for (_, special), entries in texts.items():
        ids = encoder.tokenizer([text for _, _, text in entries], add_special_tokens=special)
        for (index, column, _), token_ids in zip(entries, ids["input_ids"], strict=True):
            target = prepared[index]
            assert target is not None
            target[column] = [int(token) for token in token_ids]
    finished = [encoder.finish(item) if item is not None else None for item in prepared]
    return finished, errors


def _map_batch(batch: dict[str, list[Any]], encoder: RowEncoder) -> dict[str, list[Any]]:
    """``Dataset.map`` function: a columnar batch in, the new columns (+ errors) out."""
    count = len(next(iter(batch.values()))) if batch else 0
    rows = [{key: values[i] for key, values in batch.items()} for i in range(count)]
    items, errors = encode_rows(rows, encoder)
    columns = sorted({key for item in items if item is not None for key in item})
    out: dict[str, list[Any]] = {
        key: [item.get(key) if item is not None else None for item in items] for key in columns
    }
    out[ERROR_COLUMN] = errors
    return out


@dataclass
class EncodedPart:
    """One table with its new columns: an Arrow dataset, or Python rows."""

    part: TablePart
    """The source table (for row locations)."""
    rows: datasets.Dataset | list[dict[str, Any]]
    """The rows with the new columns (no error column)."""


def encode_parts(
    parts: Sequence[TablePart], encoder: RowEncoder, num_proc: int = 1
) -> list[EncodedPart]:
    """Each table's rows with the encoder's new columns; the first bad row (in file order)
    raises :class:`DataError` naming its file, row, field and fix."""
    return [_encode_part(part, encoder, num_proc) for part in parts]


def _encode_part(part: TablePart, encoder: RowEncoder, num_proc: int) -> EncodedPart:
    import pyarrow.compute as pc

    if isinstance(part.rows, list):
        items, errors = encode_rows(part.rows, encoder)
        _raise_first(part, errors, encoder)
        merged: list[dict[str, Any]] = [
            {**row, **(item or {})} for row, item in zip(part.rows, items, strict=True)
        ]
        return EncodedPart(part, merged)
    procs = max(1, min(num_proc, len(part.rows) // _MAP_BATCH_SIZE or 1))
    mapped = part.rows.map(
        _map_batch,
        batched=True,
        batch_size=_MAP_BATCH_SIZE,
        num_proc=procs if procs > 1 else None,
        fn_kwargs={"encoder": encoder},
        desc=f"tokenizing {part.file or 'rows'}",
    )
    column = mapped.data.column(ERROR_COLUMN)
    bad = pc.indices_nonzero(pc.not_equal(column, "")).to_numpy()
    if len(bad):
        _raise_first(part, {int(bad[0]): column[int(bad[0])].as_py()}, encoder)
    return EncodedPart(part, mapped.remove_columns(ERROR_COLUMN))


def _raise_first(
    part: TablePart, errors: Sequence[str] | dict[int, str], encoder: RowEncoder
) -> None:
    entries = errors.items() if isinstance(errors, dict) else enumerate(errors)
    for index, error in entries:
        if not error:
            continue
        field, problem, fix = json.loads(error)
        original = part.original_row(index)
        if original is not None:
            # Checked again as written: Arrow reads an absent key as null, and the message
            # should say which it was.
            try:
                encoder.prepare(original)
            except DataError as exact:
                field, problem, fix = exact.field, exact.problem, exact.fix
        raise DataError(part.source(index), field, problem, fix)


def list_lengths(rows: datasets.Dataset | list[dict[str, Any]], column: str) -> np.ndarray:
    """Length of the token list in ``column`` of every row, shape ``(N,)``."""
    import pyarrow.compute as pc

    if isinstance(rows, list):
        return np.array([len(row[column]) for row in rows], dtype=np.int64)
    return pc.list_value_length(rows.data.column(column)).to_numpy(zero_copy_only=False)
