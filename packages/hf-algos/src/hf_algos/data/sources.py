"""Dataset files through Hugging Face ``datasets``: one table per file, rows located for errors.

Local ``.jsonl`` / ``.json`` / ``.parquet`` / ``.arrow`` files load with
``datasets.load_dataset`` (Arrow-backed, memory-mapped, cached), a directory written by
``Dataset.save_to_disk`` with ``datasets.load_from_disk``; a ``reasoning_gym:<task>?...``
spec gives the rows it generates (:mod:`hf_algos.data.reasoning_gym`). Each file stays its
own table so an error names its file and row. Rows that Arrow cannot hold in one table (a
column that is a string in one row and a message list in another, mixed number / text
ground truths) are kept as Python rows instead, and still work.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from hf_algos.data.file_checks import TEXT_SUFFIXES, check_utf8
from hf_algos.data.files import DataError, PathsLike, RowSource, _read_jsonl, _read_parquet
from hf_algos.data.reasoning_gym import (
    is_reasoning_gym_spec,
    parse_reasoning_gym_spec,
    reasoning_gym_rows,
)

logger = logging.getLogger(__name__)

_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
"""File suffix -> the ``datasets`` packaged builder that reads it."""

if TYPE_CHECKING:  # imported when a dataset is built: a scoring process never pays for it
    import datasets

Rows: TypeAlias = "datasets.Dataset | list[dict[str, Any]]"
"""A table's rows: Arrow-backed, or Python dicts where Arrow cannot hold them."""


@dataclass
class TablePart:
    """The rows of one file (or of the rows given directly) and where they came from."""

    file: str | None
    """The file or dataset directory; ``None`` for rows given as a list."""
    rows: Rows
    """The rows, in file order."""
    given: list[dict[str, Any]] | None = None
    """The rows as given (a list of dicts), before Arrow filled in absent keys."""

    def source(self, index: int) -> RowSource:
        """The :class:`RowSource` of row ``index`` (jsonl: its 1-based line)."""
        if self.file is not None and self.file.lower().endswith(".jsonl"):
            return RowSource(self.file, _jsonl_line(Path(self.file), index))
        return RowSource(self.file, index)

    def original_row(self, index: int) -> dict[str, Any] | None:
        """Row ``index`` as written (a jsonl line, a given dict), where Arrow may have
        changed it (an absent key reads as null there); ``None`` where it cannot have."""
        if self.given is not None:
            return self.given[index]
        if self.file is not None and self.file.lower().endswith(".jsonl"):
            line = _jsonl_line(Path(self.file), index)
            with Path(self.file).open("rb") as handle:
                for number, raw in enumerate(handle, start=1):
                    if number == line:
                        row = json.loads(raw)
                        return row if isinstance(row, dict) else None
        return None


def load_parts(data: PathsLike | list[dict[str, Any]] | datasets.Dataset) -> list[TablePart]:
    """The tables of ``data``: files / saved dataset directories, a ``datasets.Dataset``,
    or a list of row dicts. A file that cannot be read, or that has no rows, raises
    :class:`DataError` naming it (and, for jsonl, the line); so does an empty list or
    ``datasets.Dataset``."""
    import datasets

    if isinstance(data, datasets.Dataset | list) and len(data) == 0:
        kind = "datasets.Dataset" if isinstance(data, datasets.Dataset) else "list of rows"
        raise DataError(f"the given {kind}", None, "it has no rows", "give at least one row")
    if isinstance(data, datasets.Dataset):
        return [TablePart(None, data)]
    if isinstance(data, list) and all(isinstance(row, dict) for row in data):
        given = [dict(row) for row in data]
        return [TablePart(None, _arrow_or_python(given, None), given)]
    paths = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    parts = [TablePart(str(path), _load_source(path)) for path in paths]
    for part in parts:
        if len(part.rows) == 0:
            fix = "add rows or leave the file out"
            raise DataError(str(part.file), None, "the file has no rows", fix)
    return parts


def _load_source(path: str | os.PathLike[str]) -> Rows:
    """A file, a saved dataset directory, or a ``reasoning_gym:`` spec's generated rows."""
    if not is_reasoning_gym_spec(path):
        return _load_path(Path(path))
    spec = str(path)
    try:
        rows = reasoning_gym_rows(parse_reasoning_gym_spec(spec))
    except ValueError as error:
        fix = "fix the spec (docs/data.md, 'Tasks from reasoning-gym')"
        raise DataError(spec, None, str(error), fix) from error
    return _arrow_or_python(rows, spec)


def _load_path(path: Path) -> Rows:
    import datasets

    if path.is_dir():
        return _load_saved(path)
    suffix = path.suffix.lower()
    if suffix not in _BUILDERS:
        raise ValueError(
            f"unsupported dataset file {str(path)!r}: the name must end with one of "
            f"{tuple(_BUILDERS)} (JSON lines, JSON, parquet, Arrow), or give a directory "
            f"written by datasets.Dataset.save_to_disk"
        )
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {str(path)!r} does not exist")
    if suffix in TEXT_SUFFIXES:  # Arrow's JSON reader keeps bytes that are not UTF-8
        check_utf8(path)
    try:
        loaded = datasets.load_dataset(_BUILDERS[suffix], data_files=str(path), split="train")
    except Exception as error:
        return _reread(path, suffix, error)
    assert isinstance(loaded, datasets.Dataset)
    return loaded


def _reread(path: Path, suffix: str, error: Exception) -> Rows:
    """A file ``datasets`` could not load: read it in Python to name the bad line, or keep
    its rows in Python when they are fine but mix types within a column."""
    logger.debug("datasets could not load %s (%s); reading it in Python", path, error)
    if suffix == ".jsonl":
        rows = [row for _, row in _read_jsonl(path)]
    elif suffix == ".parquet":
        rows = [row for _, row in _read_parquet(path)]
    else:
        raise DataError(
            str(path),
            None,
            f"cannot be read as {suffix} ({type(error).__name__}: {error})",
            "write it with datasets (Dataset.to_json / to_parquet / save_to_disk) or pandas",
        ) from error
    if not rows:
        raise DataError(str(path), None, "the file has no rows", "add rows or leave the file out")
    return _arrow_or_python(rows, str(path))


def _arrow_or_python(rows: list[dict[str, Any]], file: str | None) -> Rows:
    import datasets

    try:
        return datasets.Dataset.from_list(rows)
    except Exception as error:
        logger.info(
            "%s: the rows mix types within a column (%s: %.200s), so they are tokenized in "
            "the driver without the datasets cache; give each column one type to use it",
            file or "the given rows",
            type(error).__name__,
            error,
        )
        return rows


def _load_saved(path: Path) -> Rows:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as error:
        raise DataError(
            str(path),
            None,
            f"is a directory but not a saved dataset ({type(error).__name__}: {error})",
            "give a directory written by datasets.Dataset.save_to_disk, or the data files",
        ) from error
    if isinstance(loaded, datasets.DatasetDict):
        splits = sorted(loaded)
        if len(splits) != 1:
            raise DataError(
                str(path),
                None,
                f"holds the splits {splits}",
                f"name one split's directory, e.g. {str(path / splits[0])!r}",
            )
        loaded = loaded[splits[0]]
    return loaded


def _jsonl_line(path: Path, index: int) -> int:
    """The 1-based line of row ``index`` of a jsonl file (blank lines hold no row)."""
    seen = -1
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                seen += 1
                if seen == index:
                    return number
    return index + 1


def row_count(parts: Sequence[TablePart]) -> int:
    """Rows over all ``parts``."""
    return sum(len(part.rows) for part in parts)
