"""Shared fixtures: tiny models built locally (no hub), once per test session; a one-rank
process group for in-process engine tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from hf_engines.testing import build_tiny_model

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Directories of tiny random Llama, Qwen2 (tied embeddings), Qwen3, Qwen3-MoE and
    Gemma 3 (sliding-window and global layers) models."""
    root = tmp_path_factory.mktemp("tiny-models")
    families = ("llama", "qwen2", "qwen3", "qwen3_moe", "gemma3")
    return {family: build_tiny_model(root / family, family) for family in families}


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A world of one gloo rank in this process."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray cluster on loopback, shared by every test of the session."""
    import ray

    from hf_controller import ensure_ray

    ensure_ray(num_cpus=4, log_to_driver=False)
    yield ray
    ray.shutdown()
