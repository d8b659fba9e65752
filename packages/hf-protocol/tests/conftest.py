"""Shared fixtures: a realistic small batch, and one Ray cluster per test session."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from hf_protocol import DataProto


def build_batch(length: int = 10, seq_len: int = 4, seed: int = 0) -> DataProto:
    """A batch shaped like a rollout: tensors of several dtypes, strings, ragged lists."""
    generator = torch.Generator().manual_seed(seed)
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.randint(0, 100, (length, seq_len), generator=generator),
            "attention_mask": torch.ones(length, seq_len, dtype=torch.bool),
            "old_log_probs": torch.randn(length, seq_len, generator=generator).to(torch.bfloat16),
            "values": torch.randn(length, generator=generator),
        },
        non_tensors={
            "uid": [f"prompt-{i // 2}" for i in range(length)],
            "tags": [list(range(i % 3)) for i in range(length)],
            "score": np.arange(length, dtype=np.float64),
        },
        meta_info={"temperature": 0.7, "global_step": 3},
    )


@pytest.fixture
def make_batch() -> Callable[..., DataProto]:
    """Factory for :func:`build_batch` batches."""
    return build_batch


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """One local Ray on loopback for the whole session (start-up costs seconds)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
