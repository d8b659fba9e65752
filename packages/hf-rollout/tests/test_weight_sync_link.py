"""hf_rollout.weight_sync end to end on Ray: a WeightLink opens the channel between a 2-rank
sender group (a worker mixing in WeightSending, as the trainers' actor does) and 2 rollout
ranks, pushes, and the rollout then generates with the sender's weights."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ray import cloudpickle
from transformers import AutoModelForCausalLM

from hf_controller import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
)
from hf_protocol import DataProto
from hf_rollout import RolloutConfig, SamplingConfig, WeightLink
from hf_rollout.backends.native import NativeRollout
from hf_rollout.base import pad_responses_to
from hf_rollout.testing import make_prompts, random_prompt_ids
from hf_rollout.weight_sync import WeightSending
from hf_rollout.workers import RolloutWorker

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

PAD = 0
GREEDY = SamplingConfig(greedy=True, max_new_tokens=6, eos_token_id=1, n=2)


class ModelSender(WeightSending, Worker):
    """Every rank holds a model; the weight methods come from WeightSending."""

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = AutoModelForCausalLM.from_pretrained(model)

    def iter_full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.model.state_dict().items()


def generate(model: Path, prompts: DataProto) -> DataProto:
    engine = NativeRollout(RolloutConfig(model_path=str(model), pad_token_id=PAD))
    return pad_responses_to(engine.generate(prompts, GREEDY), GREEDY.max_new_tokens, PAD)


@pytest.mark.timeout(300)
def test_link_opens_pushes_and_closes(ray_session: Any, tiny_models: dict[str, Path]) -> None:
    sender = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False),
        RayClassWithInitArgs(ModelSender, str(tiny_models["qwen2_other"])),
        name_prefix="sender",
    )
    rollout = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False),
        RayClassWithInitArgs(
            RolloutWorker, RolloutConfig(model_path=str(tiny_models["qwen2"]), pad_token_id=PAD)
        ),
        name_prefix="rollout",
    )
    link = WeightLink(sender, rollout, fused=False, bucket_bytes=1 << 16)  # type: ignore[arg-type]
    try:
        rollout.init_model()
        assert not link.ready
        with pytest.raises(RuntimeError, match=r"the weight channel is not open; call open\(\)"):
            link.start_push()
        link.open()
        assert link.ready
        prompts = make_prompts(random_prompt_ids(3, seed=2), PAD)
        prompts.meta_info["sampling"] = GREEDY
        expected = generate(tiny_models["qwen2_other"], prompts).batch["responses"]
        before = rollout.generate_sequences(prompts).batch
        assert not torch.equal(before["responses"], expected)  # the models answer differently
        assert (before["rollout_policy_version"] == 0).all()  # the initial weights
        link.push()
        after = rollout.generate_sequences(prompts).batch
        assert torch.equal(after["responses"], expected)
        assert (after["rollout_policy_version"] == 1).all()  # as the channel delivered it
        link.start_push(buffered=True, version=7).wait()  # a buffered push, same weights
        after = rollout.generate_sequences(prompts).batch
        assert torch.equal(after["responses"], expected)
        assert (after["rollout_policy_version"] == 7).all()
        link.close()
        link.close()  # idempotent
        assert not link.ready
    finally:
        sender.shutdown()
        rollout.shutdown()
