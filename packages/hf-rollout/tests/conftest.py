"""Shared fixtures: tiny models built locally (no hub), once per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_rollout.testing import build_tiny_model

torch.set_num_threads(1)  # several test runs share two cores
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Directories of tiny random models: ``llama``, ``qwen2``, ``qwen3`` and ``qwen2_other``.

    ``qwen2_other`` has the architecture of ``qwen2`` with different weights (another seed).
    """
    root = tmp_path_factory.mktemp("tiny-models")
    return {
        "llama": build_tiny_model(root / "llama", "llama"),
        "qwen2": build_tiny_model(root / "qwen2", "qwen2"),
        "qwen3": build_tiny_model(root / "qwen3", "qwen3"),
        "qwen2_other": build_tiny_model(root / "qwen2_other", "qwen2", seed=1),
    }


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray cluster on loopback, shared by every test of the session."""
    import ray

    from hf_controller import ensure_ray

    ensure_ray(num_cpus=4, log_to_driver=False)
    yield ray
    ray.shutdown()
