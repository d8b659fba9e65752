"""Shared fixtures of hf-algos tests: one Ray per session, tiny models (dense and MoE) with
a tokenizer, the toy task's scoring function in the global registry."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .toy_task import SORT_DIGITS_SOURCE, score_sorted_digits

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray cluster on loopback, shared by every test of the session."""
    import ray

    from hf_controller import ensure_ray

    ensure_ray(num_cpus=4, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def _own_working_directory(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test runs in a directory of its own, so a trainer's default outputs
    (``outputs/<project>/<experiment>/...``) never land in the repository or in another
    test's checkpoints."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(scope="session")
def moe_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3-MoE (wide weights, so a flipped expert changes the output) with
    the character tokenizer next to it."""
    from hf_algos.data import build_char_tokenizer
    from hf_protocol.testing import save_tiny_model, tiny_decoder_config

    config = tiny_decoder_config("qwen3_moe", initializer_range=0.2)
    directory = save_tiny_model(tmp_path_factory.mktemp("moe") / "qwen3_moe", config)
    build_char_tokenizer(directory, chat_template=None)
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (vocab 128) saved with the character tokenizer next to it."""
    from hf_algos.data import build_char_tokenizer
    from hf_engines.testing import build_tiny_model

    directory = build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama")
    build_char_tokenizer(directory, chat_template=None)
    return directory


@pytest.fixture
def toy_task_scored() -> Iterator[str]:
    """The toy task's scoring function registered, as a user registers theirs, for one test.

    The trainers' reward manager reads the global registry; the entry is removed afterwards
    so no other test sees it. Yields the task's ``data_source``.
    """
    from hf_algos.rewards import SCORING_FUNCTIONS, register_scoring_function

    register_scoring_function(SORT_DIGITS_SOURCE, score_sorted_digits)
    try:
        yield SORT_DIGITS_SOURCE
    finally:
        SCORING_FUNCTIONS.pop(SORT_DIGITS_SOURCE, None)
