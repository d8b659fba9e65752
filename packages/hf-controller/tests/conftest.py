"""One Ray per test session (start-up costs seconds), and the Rows helper type."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
sys.path.insert(0, os.path.dirname(__file__))

import rows


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray cluster on loopback, shared by every test of the session."""
    import ray
    from ray import cloudpickle

    from hf_controller import ensure_ray

    cloudpickle.register_pickle_by_value(rows)  # workers cannot import tests/rows.py
    ensure_ray(num_cpus=4, log_to_driver=False)
    yield ray
    ray.shutdown()
