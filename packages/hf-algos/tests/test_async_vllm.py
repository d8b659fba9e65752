"""``trainer.async_mode`` with the vLLM rollout backend: the same pipeline as
``test_async_modes`` (generate_sequences + the weight channel), on vLLM's CPU build.

vLLM lives in its own venv (``tools/setup_vllm_env.sh``, which also installs hf-algos);
``tools/test_all.sh`` runs this file there. Skipped where vLLM is not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from .test_async_modes import FINITE, PARTIAL, async_overrides, run
from .trainer_helpers import assert_finite

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def wide_head_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen2 with head size 32 and the character tokenizer: vLLM's CPU attention
    rejects the default tiny model's head size of 8."""
    from hf_algos.data import build_char_tokenizer
    from hf_rollout.testing import build_tiny_model

    shape = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2}
    directory = tmp_path_factory.mktemp("vllm") / "qwen2"
    build_tiny_model(directory, "qwen2", num_key_value_heads=1, **shape)
    build_char_tokenizer(directory, chat_template=None)
    return directory


def vllm_overrides(model: Path, root: Path, mode: str, steps: int) -> list[str]:
    """The async test's run on the vLLM backend, rollout log-probs kept for the correction."""
    return [
        *async_overrides(model, root, mode, steps),
        "rollout.backend=vllm",
        "trainer.resume_mode=disable",
    ]


def test_one_step_off_on_vllm_lags_by_one(
    ray_session: Any, toy_task_scored: str, wide_head_model: Path, tmp_path: Path
) -> None:
    history, prompts = run(vllm_overrides(wide_head_model, tmp_path, "one_step_off", steps=3))
    assert len(history) == 3
    assert_finite(history, (*FINITE, "rollout_correction/kl_k3"))
    assert history[0]["async/staleness_hist/0"] == 8  # 4 prompts x 2 samples
    assert all(m["async/staleness_hist/1"] == 8 for m in history[1:])
    # vLLM's log-probs of the samples against the actor's recomputed ones: a version apart
    # after step 1, yet the same model family and precision, so the mismatch stays small
    assert all(0.0 <= m["rollout_correction/kl_k3"] < 1.0 for m in history)
    assert [len(p) for p in prompts] == [8] * 3


def test_fully_async_partial_rollout_on_vllm_spans_versions(
    ray_session: Any, toy_task_scored: str, wide_head_model: Path, tmp_path: Path
) -> None:
    overrides = [
        *vllm_overrides(wide_head_model, tmp_path, "fully_async", steps=4),
        *PARTIAL,
    ]
    history, _ = run(overrides)
    assert len(history) == 4
    assert_finite(history, (*FINITE, "async/mixed_version_samples"))
    assert sum(m["async/mixed_version_samples"] for m in history) > 0
