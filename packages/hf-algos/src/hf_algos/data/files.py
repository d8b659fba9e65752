"""Reading and writing dataset rows as local jsonl or parquet files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_controller import ConfigurationError

_FORMATS = (".jsonl", ".parquet")

PathsLike = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""One dataset file or several."""


@dataclass(frozen=True)
class RowSource:
    """Where a dataset row came from, for error messages that point at it."""

    file: str | None
    """The file, or ``None`` for rows given directly as a list."""
    number: int
    """jsonl: the 1-based line; parquet: the 0-based row index; a list: the 0-based index."""

    def describe(self) -> str:
        """``data.jsonl, line 3``, ``data.parquet, row 2 (0-based)`` or ``row 2 of the given
        rows``."""
        if self.file is None:
            return f"row {self.number} of the given rows"
        if self.file.lower().endswith(".jsonl"):
            return f"{self.file}, line {self.number}"
        return f"{self.file}, row {self.number} (0-based)"


class DataError(ConfigurationError):
    """A dataset file or row that cannot be used; the message names the file, row and field.

    Raised while a dataset is built, before any worker starts. A user error, so a
    :class:`~hf_controller.ConfigurationError` (and a ``ValueError``): the ``hybridflow``
    command prints it alone and exits 2.
    """

    def __init__(self, source: RowSource | str, field: str | None, problem: str, fix: str) -> None:
        where = source.describe() if isinstance(source, RowSource) else source
        what = f"field {field!r} " if field is not None else ""
        super().__init__(f"{where}: {what}{problem}; {fix}")
        self.source = source
        self.field = field
        self.problem = problem
        self.fix = fix

    def __reduce__(self) -> tuple[type[DataError], tuple[Any, ...]]:
        # Rebuilt from its parts (the default would call __init__ with the message alone).
        return DataError, (self.source, self.field, self.problem, self.fix)


LocatedRow = tuple[RowSource, dict[str, Any]]
"""A row and where it came from."""


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in _FORMATS:
        raise ValueError(
            f"unsupported dataset file {str(path)!r}: the name must end with one of {_FORMATS} "
            f"(one JSON object per line, or a parquet table)."
        )
    return suffix


def read_rows(paths: PathsLike) -> list[dict[str, Any]]:
    """All rows of one or more local ``.jsonl`` / ``.parquet`` files, in file order.

    A file that cannot be read as its suffix says (a jsonl line that is not a JSON object,
    a file that is not parquet) or that has no rows raises :class:`DataError` naming the
    file and, for jsonl, the line.
    """
    return [row for _, row in read_located_rows(paths)]


def read_located_rows(paths: PathsLike) -> list[LocatedRow]:
    """Like :func:`read_rows`, each row with its :class:`RowSource`."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    rows: list[LocatedRow] = []
    for raw in paths:
        path = Path(raw)
        suffix = _suffix(path)
        if not path.is_file():
            raise FileNotFoundError(f"dataset file {str(path)!r} does not exist")
        found = _read_jsonl(path) if suffix == ".jsonl" else _read_parquet(path)
        if not found:
            raise DataError(
                str(path), None, "the file has no rows", "add rows or leave the file out"
            )
        rows.extend(found)
    return rows


def load_rows(data: PathsLike | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows given directly (a list of dicts), or read from files by :func:`read_rows`."""
    return [row for _, row in load_located_rows(data)]


def load_located_rows(data: PathsLike | list[dict[str, Any]]) -> list[LocatedRow]:
    """Like :func:`load_rows`, each row with its :class:`RowSource`."""
    if isinstance(data, list) and all(isinstance(row, dict) for row in data):
        return [(RowSource(None, index), dict(row)) for index, row in enumerate(data)]
    return read_located_rows(data)  # type: ignore[arg-type]


def write_rows(rows: Iterable[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write ``rows`` to ``path`` as jsonl or parquet (chosen by the suffix); return the path."""
    target = Path(path)
    suffix = _suffix(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    if suffix == ".jsonl":
        with target.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise ValueError(
                f"cannot write {str(target)!r} as parquet: {error}. A parquet column holds one "
                f"type (e.g. every prompt a string, or every prompt a message list); write "
                f"mixed rows as .jsonl instead."
            ) from error
        pq.write_table(table, target)
    return target


def _read_jsonl(path: Path) -> list[LocatedRow]:
    rows: list[LocatedRow] = []
    fix = "write one JSON object per line (json.dumps(row) + newline)"
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            source = RowSource(str(path), number)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(source, None, f"is not UTF-8 text ({error})", fix) from error
            if not line.strip():
                continue
            try:
                row = json.loads(line.strip())
            except json.JSONDecodeError as error:
                problem = f"is not valid JSON ({error.msg} at column {error.colno})"
                raise DataError(source, None, problem, fix) from error
            if not isinstance(row, dict):
                raise DataError(source, None, f"is {row!r:.80}, not a JSON object", fix)
            rows.append((source, row))
    return rows


def _read_parquet(path: Path) -> list[LocatedRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as error:
        raise DataError(
            str(path),
            None,
            f"is not a readable parquet file ({error})",
            "write it with pyarrow.parquet.write_table / pandas.DataFrame.to_parquet, or name "
            "a JSON-lines file .jsonl",
        ) from error
    return [(RowSource(str(path), index), row) for index, row in enumerate(table.to_pylist())]
