"""Cheap checks of a dataset file's bytes, run before anything reads its rows: text files
(``.jsonl`` / ``.json``) must be UTF-8, a jsonl file's first row a JSON object with the
prompt, a parquet file must carry parquet's magic bytes.

Each raises :class:`~hf_algos.data.files.DataError` (one line, exit 2) naming the file and
where: for bytes that are not UTF-8, the byte offset and line of the first one (Arrow's JSON
reader keeps them, and tokenizing then fails with a ``UnicodeDecodeError`` traceback).
Reading a file costs about a second per GB; a file already checked (same size and
modification time) is not read again in this process.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path

from hf_algos.data.files import DataError, RowSource

TEXT_SUFFIXES = (".jsonl", ".json")
"""Dataset files that are text, and so must be UTF-8."""

_CHUNK = 1 << 24
_PARQUET_MAGIC = b"PAR1"
_checked: dict[str, tuple[int, int]] = {}
"""Files found UTF-8 in this process: resolved path -> (size, modification time in ns)."""


def check_file_bytes(path: Path, prompt_key: str | None = None) -> None:
    """Check ``path`` as its suffix says: UTF-8 text (``.jsonl`` / ``.json``), a first jsonl
    row that is a JSON object with ``prompt_key`` (when given), parquet's magic bytes."""
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        check_utf8(path)
    if suffix == ".jsonl":
        check_first_row(path, prompt_key)
    elif suffix == ".parquet":
        check_parquet_magic(path)


def check_utf8(path: Path) -> None:
    """Raise :class:`DataError` naming the line and byte offset of the first byte of
    ``path`` that is not UTF-8, and the fix."""
    stat = path.stat()
    key, signature = str(path.resolve()), (stat.st_size, stat.st_mtime_ns)
    if _checked.get(key) == signature:
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, newlines = 0, 0  # bytes and newlines before the current chunk
    with path.open("rb") as handle:
        while True:
            chunk = handle.read(_CHUNK)
            pending = decoder.getstate()[0]  # an unfinished character from the last chunk
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as error:
                data = pending + chunk
                raise _not_utf8(path, error, offset - len(pending), newlines, data) from None
            if not chunk:
                break
            offset += len(chunk)
            newlines += chunk.count(b"\n")
    _checked[key] = signature


def _not_utf8(
    path: Path, error: UnicodeDecodeError, start: int, newlines: int, data: bytes
) -> DataError:
    """The error for ``data`` (read from byte ``start`` of ``path``, after ``newlines``
    newlines) failing to decode at ``error.start``."""
    before = data[: error.start]
    line = newlines + before.count(b"\n") + 1
    column = error.start - (before.rfind(b"\n") + 1) + 1
    bad = data[error.start : error.end]
    problem = (
        f"is not UTF-8 text: byte 0x{bad[0]:02x} at byte offset {start + error.start} (line "
        f"{line}, byte {column} of the line) cannot be decoded ({error.reason})"
    )
    fix = (
        f"re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 {path.name} > "
        f"fixed{path.suffix}` when it is Latin-1), or fix that line"
    )
    return DataError(
        RowSource(str(path), line) if path.suffix == ".jsonl" else str(path), None, problem, fix
    )


def check_first_row(path: Path, prompt_key: str | None) -> None:
    """The first non-blank line of jsonl ``path`` is a JSON object (with ``prompt_key``)."""
    fix = "write one JSON object per line (json.dumps(row) + newline)"
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            source = RowSource(str(path), number)
            try:
                row = json.loads(raw.decode("utf-8"))
            except json.JSONDecodeError as error:
                problem = f"is not valid JSON ({error.msg} at column {error.colno})"
                raise DataError(source, None, problem, fix) from None
            if not isinstance(row, dict):
                raise DataError(source, None, f"is {row!r:.80}, not a JSON object", fix)
            if prompt_key is not None and row.get(prompt_key) is None:
                problem = (
                    "is null" if prompt_key in row else f"is missing (the row has {sorted(row)})"
                )
                prompt_fix = (
                    f"give every row a {prompt_key!r} (a string or a list of chat messages), "
                    "or set data.prompt_key to the prompt column"
                )
                raise DataError(source, prompt_key, problem, prompt_fix)
            return


def check_parquet_magic(path: Path) -> None:
    """``path`` starts and ends with parquet's magic bytes ``PAR1``."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(4)
        handle.seek(max(0, size - 4))
        tail = handle.read(4)
    if size < 12 or head != _PARQUET_MAGIC or tail != _PARQUET_MAGIC:
        raise DataError(
            str(path),
            None,
            f"is not a parquet file (it does not begin and end with {_PARQUET_MAGIC!r}: "
            f"{head!r} ... {tail!r})",
            "write it with pyarrow.parquet.write_table / pandas.DataFrame.to_parquet, or name "
            "a JSON-lines file .jsonl",
        )
