"""Fixtures for the recipe tests: the repository root on sys.path, one Ray per session.

Recipes are not an installed package; they import as ``recipes.<name>`` from the
repository root. Ray workers get the same root on their ``PYTHONPATH`` so they
import the recipe's modules whatever directory pytest was started from.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before anything imports ray

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def python_path_with_repo_root() -> str:
    """``PYTHONPATH`` with the repository root in front (for workers and subprocesses)."""
    existing = os.environ.get("PYTHONPATH")
    return os.pathsep.join([str(REPO_ROOT), *([existing] if existing else [])])


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray on loopback (CPU only), shared by every test of the session."""
    import ray

    from hf_controller import ensure_ray

    ensure_ray(
        num_cpus=2,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": python_path_with_repo_root()}},
    )
    yield ray
    ray.shutdown()
