"""Word counts: the mergeable result of the map step, and the tokeniser that makes it.

``WordCounts`` offers a static ``concat(items)``, so a ``DP_COMPUTE_PROTO``
method that returns one per worker is merged by the controller's collect step
without any code in the driver.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# A word is a run of letters, with inner apostrophes kept ("don't", "o'clock").
# Only ASCII letters: the point is a fixed, documented rule that any reference
# implementation can reproduce, not linguistic accuracy.
WORD_PATTERN = re.compile(r"[a-z]+(?:'[a-z]+)*")


@dataclass
class WordCounts:
    """Totals over some files: how often each word occurs, plus file, line and byte counts."""

    words: Counter[str] = field(default_factory=Counter)
    """Occurrences of each lower-cased word."""
    files: int = 0
    """Number of files counted."""
    lines: int = 0
    """Number of lines (newline characters, plus a last line without one)."""
    bytes: int = 0
    """Size of the files in bytes, as stored on disk."""

    @property
    def total_words(self) -> int:
        """Number of words, repeats included."""
        return sum(self.words.values())

    def top(self, k: int) -> list[tuple[str, int]]:
        """The ``k`` most frequent words with their counts; ties broken alphabetically."""
        return sorted(self.words.items(), key=lambda item: (-item[1], item[0]))[:k]

    @staticmethod
    def concat(items: Sequence[WordCounts]) -> WordCounts:
        """Merge per-worker (or per-call) counts into one: the reduce step."""
        merged = WordCounts()
        for item in items:
            merged.words.update(item.words)
            merged.files += item.files
            merged.lines += item.lines
            merged.bytes += item.bytes
        return merged


def count_text(text: str) -> Counter[str]:
    """Occurrences of each word of ``text``, lower-cased (see ``WORD_PATTERN``)."""
    return Counter(WORD_PATTERN.findall(text.lower()))


def count_files(paths: Iterable[str | Path]) -> WordCounts:
    """Read each file (UTF-8, undecodable bytes replaced) and count its words and lines."""
    result = WordCounts()
    for path in paths:
        data = Path(path).read_bytes()
        text = data.decode("utf-8", errors="replace")
        result.words.update(count_text(text))
        result.files += 1
        result.bytes += len(data)
        result.lines += data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    return result
