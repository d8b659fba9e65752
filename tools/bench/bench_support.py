"""Helpers shared by the benchmarks in ``tools/bench``.

A local Ray node that stays on loopback, switches set through environment
variables for the duration of one case, a one-line description of the machine,
and the generated block a benchmark writes into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np

MIB = 1 << 20
GB = 1e9  # throughput is reported in decimal GB/s


def import_problem(module: str | None) -> str | None:
    """Why ``module`` cannot be imported, or ``None`` when it can (or none is needed)."""
    if module is None:
        return None
    try:
        importlib.import_module(module)
    except Exception as exc:  # verl can fail on any missing dependency, not just itself
        return f"{type(exc).__name__}: {exc}"
    return None


@contextlib.contextmanager
def scoped_env(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore them."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def column_env(threads: int) -> dict[str, str]:
    """Environment of a benchmark column's process (the side-by-side benches run each
    contender in a process of its own).

    ``OMP_NUM_THREADS`` is ``threads`` so that processes a column starts (HybridFlow's Ray
    workers, where Ray would otherwise set 1) use as many torch threads as the others.
    ``OMP_WAIT_POLICY=PASSIVE`` (unless already set): with the default spinning waits, two
    torch threads on a shared 2-core machine made a GRPO step take 8-27 s instead of 0.3 s.
    """
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }


def keep_ray_local() -> None:
    """Call before anything imports Ray (verl does, at import): Ray reads this variable
    when it is imported, and "0" keeps the node on 127.0.0.1."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


def start_ray(object_store_gb: float, num_cpus: int = 1) -> ModuleType:
    """Start one local Ray node without a dashboard and return the ``ray`` module.

    ``num_cpus`` is Ray's logical CPU count, not a limit on real cores. One is enough
    when the driver only ``put``s and ``get``s (fewer idle workers leave more of a
    small machine to the driver); worker-group benchmarks raise it so that every
    placement-group bundle they ask for can be granted.
    """
    import ray

    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        object_store_memory=int(object_store_gb * GB),
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    return ray


def prime_object_store(ray: ModuleType, object_store_gb: float, chunk_mib: int = 256) -> None:
    """Write once over most of the object store, then free it.

    Shared-memory pages are faulted in on first write; without this the first case
    measured pays that cost and later ones reuse warm pages, which biases the order.
    """
    chunk = np.ones(chunk_mib * MIB, dtype=np.uint8)
    count = max(1, int(object_store_gb * GB * 0.8) // chunk.nbytes)
    refs = [ray.put(chunk) for _ in range(count)]
    del refs
    gc.collect()
    time.sleep(0.5)  # the store frees objects asynchronously


def machine_line(modules: list[str]) -> str:
    """Cores, memory and the Python version, plus the version of each importable module."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    versions = [f"Python {platform.python_version()}"]
    for name in modules:
        if import_problem(name) is None:
            module = importlib.import_module(name)
            versions.append(f"{name} {getattr(module, '__version__', '?')}")
    return f"{os.cpu_count()} cores, {memory_gib:.0f} GiB RAM, CPU only; " + ", ".join(versions)


def write_section(path: Path, key: str, title: str, body: str) -> None:
    """Put ``body`` between the ``key`` markers in ``path``.

    Only the text between the markers is replaced, so prose written around them
    survives a re-run. Without markers, a new ``title`` section holding them is
    appended (and the file created if needed).
    """
    start, end = f"<!-- bench:{key}:start -->", f"<!-- bench:{key}:end -->"
    block = f"{start}\n{body}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n{title}\n\n{block}\n"
    path.write_text(text)
