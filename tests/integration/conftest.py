"""One local Ray per test session for the cross-package tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray on loopback shared by the whole session."""
    import ray

    from hf_controller import ensure_ray

    ensure_ray(num_cpus=4, log_to_driver=False)
    yield ray
    ray.shutdown()
