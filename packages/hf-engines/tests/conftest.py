"""Shared fixtures: tiny models built locally (no hub), once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_engines.testing import build_tiny_model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Directories of tiny random Llama, Qwen2 (tied embeddings) and Qwen3 models."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {
        family: build_tiny_model(root / family, family) for family in ("llama", "qwen2", "qwen3")
    }
