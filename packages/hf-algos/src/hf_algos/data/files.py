"""Reading and writing dataset rows as local jsonl or parquet files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

_FORMATS = (".jsonl", ".parquet")

PathsLike = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""One dataset file or several."""


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in _FORMATS:
        raise ValueError(
            f"unsupported dataset file {str(path)!r}: the name must end with one of {_FORMATS} "
            f"(one JSON object per line, or a parquet table)."
        )
    return suffix


def read_rows(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> list[dict[str, Any]]:
    """All rows of one or more local ``.jsonl`` / ``.parquet`` files, in file order."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    rows: list[dict[str, Any]] = []
    for raw in paths:
        path = Path(raw)
        suffix = _suffix(path)
        if not path.is_file():
            raise FileNotFoundError(f"dataset file {str(path)!r} does not exist")
        if suffix == ".jsonl":
            rows.extend(_read_jsonl(path))
        else:
            rows.extend(_read_parquet(path))
    return rows


def load_rows(data: PathsLike | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows given directly (a list of dicts), or read from files by :func:`read_rows`."""
    if isinstance(data, list) and all(isinstance(row, dict) for row in data):
        return [dict(row) for row in data]
    return read_rows(data)  # type: ignore[arg-type]


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


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error})") from error
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: a row must be a JSON object, got {row!r:.80}")
            rows.append(row)
    return rows


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return list(pq.read_table(path).to_pylist())
