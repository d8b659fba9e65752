"""verl's ``parallel_put`` (``verl.utils.ray_utils``): many objects into Ray's store at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hf_controller.compat.verl.errors import VerlCheckError

MAX_PUT_THREADS = 16
"""Most threads :func:`parallel_put` uses when not told (verl's cap)."""


def parallel_put(data_list: list[Any], max_workers: int | None = None) -> list[Any]:
    """``ray.put`` every item of ``data_list`` from a thread pool; the object refs, in order.

    ``max_workers`` defaults to ``min(len(data_list), 16)``. An empty list is refused (as
    in verl), since it is almost always a caller's mistake.
    """
    import ray

    if not data_list:
        raise VerlCheckError(
            "parallel_put got an empty data_list; pass at least one object to put in Ray's store"
        )
    threads = max_workers if max_workers is not None else min(len(data_list), MAX_PUT_THREADS)
    if threads < 1:
        raise ValueError(f"max_workers must be >= 1 (or None), got {max_workers!r}")
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(ray.put, data_list))
