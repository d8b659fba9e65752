"""Shared by the ``hybridflow serve`` tests: a server config for a local model."""

from __future__ import annotations

from pathlib import Path

from hf_algos.config import load_config
from hf_algos.serve.config import ServeConfig


def serve_config(model: Path, state: Path, *extra: str) -> ServeConfig:
    """A server for ``model`` on a free loopback port, the worker groups in process
    (``trainer.backend=local``), checkpoints under ``state``; ``extra`` overrides win."""
    return load_config(
        ServeConfig,
        overrides=[
            f"actor.engine.model.path={model}",
            "trainer.backend=local",
            "serve.port=0",
            f"serve.state_dir={state}",
            *extra,
        ],
    )
