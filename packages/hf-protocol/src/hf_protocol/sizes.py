"""How a batch of ``total`` rows is cut into parts: pure integer arithmetic.

Every split in hf-protocol goes through these two functions, so "how are uneven
batches divided?" has exactly one answer: balanced, order kept, sizes differing
by at most one (10 rows on 4 workers -> 3/3/2/2).
"""

from __future__ import annotations


def balanced_chunk_sizes(total: int, chunks: int) -> list[int]:
    """Sizes of ``chunks`` contiguous parts covering ``total`` rows, as even as possible.

    The first ``total % chunks`` parts get one extra row. Parts may be empty when
    ``total < chunks``.

    >>> balanced_chunk_sizes(10, 4)
    [3, 3, 2, 2]
    """
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(
            f"chunks must be a positive integer (e.g. the worker group's world size), "
            f"got {chunks!r}"
        )
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    base, extra = divmod(total, chunks)
    return [base + 1 if i < extra else base for i in range(chunks)]


def fixed_split_sizes(total: int, split_size: int) -> list[int]:
    """Sizes of consecutive parts of ``split_size`` rows; the last part holds the rest.

    >>> fixed_split_sizes(10, 4)
    [4, 4, 2]
    """
    if isinstance(split_size, bool) or not isinstance(split_size, int) or split_size < 1:
        raise ValueError(f"split_size must be a positive integer, got {split_size!r}")
    full, rest = divmod(total, split_size)
    return [split_size] * full + ([rest] if rest else [])


def offsets(sizes: list[int]) -> list[tuple[int, int]]:
    """``(start, stop)`` row ranges of consecutive parts with the given sizes."""
    bounds = []
    start = 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds
