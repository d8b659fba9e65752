"""Shared fixtures of hf-algos tests: one Ray per session, a tiny model with a tokenizer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray cluster on loopback, shared by every test of the session."""
    import ray

    from hf_controller import ensure_ray

    ensure_ray(num_cpus=4, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (vocab 128) saved with the character tokenizer next to it."""
    from hf_algos.data import build_char_tokenizer
    from hf_engines.testing import build_tiny_model

    directory = build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama")
    build_char_tokenizer(directory, chat_template=None)
    return directory
