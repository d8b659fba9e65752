"""RewardModelScorer over a real RewardModelWorker group (local backend, one rank)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from hf_algos.rewards import RewardModelScorer
from hf_controller import LocalWorkerGroup, RayClassWithInitArgs
from hf_engines import EngineConfig, ModelConfig, RewardModelWorker, config_from_dict
from hf_engines.models import build_hf_model
from hf_engines.testing import build_tiny_model, make_toy_batch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("rm") / "llama", "llama")


@pytest.fixture(scope="module")
def rm_group(model_dir: Path) -> Iterator[Any]:
    config = config_from_dict(
        EngineConfig,
        {
            "model": {"path": str(model_dir), "head": "value", "seed": 5},
            "micro_batch": {"micro_batch_size": 2},
        },
    )
    group = LocalWorkerGroup(
        world_size=1, ray_cls_with_init=RayClassWithInitArgs(RewardModelWorker, config)
    )
    group.init_model()
    try:
        yield group
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_rm_scores_become_token_level_scores(rm_group: Any, model_dir: Path) -> None:
    batch = make_toy_batch(5, seed=7)
    scorer = RewardModelScorer(rm_group)
    try:
        out = scorer.score(batch)
        scores = out.batch["token_level_scores"]
        # Expected: the value head read at each row's last response token, by plain transformers.
        model = build_hf_model(ModelConfig(path=str(model_dir), head="value", seed=5))
        t = batch.batch
        with torch.no_grad():
            head = model(
                input_ids=t["input_ids"],
                attention_mask=t["attention_mask"],
                position_ids=t["position_ids"],
            ).logits.float()[:, -t["responses"].shape[1] :, 0]
        last = t["response_mask"].sum(-1) - 1
        expected = torch.zeros_like(scores)
        expected[torch.arange(5), last] = head[torch.arange(5), last]
        assert scores.dtype == torch.float32
        torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)
        mean = out.meta_info["metrics"]["reward/rm_score/mean"]
        assert mean == pytest.approx(float(expected.sum(-1).mean()), abs=1e-5)
        again = scorer.score_async(batch).result(timeout=120)
        torch.testing.assert_close(again.batch["token_level_scores"], scores)
        assert "token_level_scores" in batch.union(out).batch
    finally:
        scorer.close()


def test_scorer_rejects_a_group_without_compute_rm_score() -> None:
    with pytest.raises(TypeError, match="compute_rm_score"):
        RewardModelScorer(object())
