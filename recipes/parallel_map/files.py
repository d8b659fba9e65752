"""``FileList``: the shardable argument of the map step, and finding the input files.

The controller splits any argument that offers ``chunk(n)``; a list of paths is
all a worker needs when the files sit on storage every worker can read (one
machine, or a shared file system on a cluster), so only names travel, not bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hf_controller import split_balanced


@dataclass(frozen=True)
class FileList:
    """An ordered list of file paths that splits into balanced parts."""

    paths: tuple[str, ...]
    """Paths of the files, in a fixed order (absolute, so any process can open them)."""

    def __len__(self) -> int:
        return len(self.paths)

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def __getitem__(self, item: slice) -> FileList:
        return FileList(self.paths[item])

    def chunk(self, chunks: int) -> list[FileList]:
        """``chunks`` consecutive parts whose sizes differ by at most one (10 on 4 -> 3/3/2/2)."""
        return [FileList(tuple(part)) for part in split_balanced(self.paths, chunks)]

    @staticmethod
    def concat(items: Sequence[FileList]) -> FileList:
        """The parts joined back in order (the inverse of :meth:`chunk`)."""
        return FileList(tuple(path for item in items for path in item.paths))


def find_text_files(directory: str | Path, pattern: str = "*.txt") -> FileList:
    """Every file under ``directory`` (recursively) whose name matches ``pattern``, sorted.

    Raises:
        FileNotFoundError: ``directory`` does not exist or is not a directory.
        ValueError: no file matches, so there is nothing to count.
    """
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(
            f"input directory {str(root)!r} does not exist or is not a directory; pass an "
            f"existing folder of text files, or leave input_dir unset for a synthetic corpus"
        )
    paths = sorted(str(p.resolve()) for p in root.rglob(pattern) if p.is_file())
    if not paths:
        raise ValueError(
            f"no file under {str(root)!r} matches {pattern!r}; check the directory, or set "
            f"pattern (e.g. '*.md') to the names of your files"
        )
    return FileList(tuple(paths))


def total_bytes(files: FileList) -> int:
    """Sum of the sizes of ``files`` on disk."""
    return sum(Path(path).stat().st_size for path in files)
